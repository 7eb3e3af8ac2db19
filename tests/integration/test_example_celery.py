"""The example's Celery worker relays the outbox with no broker server (docs/outbox.md).

A real ``celery -A leasebroker worker --beat`` runs as a subprocess on kombu's
filesystem transport (the example's embedded default). A worker is provisioned over
the API's view code; the on-commit kick and the beat schedule both reach the relay,
which delivers the ``worker.provisioned`` notice exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.example_project import EXAMPLE, run_in_example, sqlite_url

PROVISION = """
import uuid
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient
user = get_user_model().objects.create(username="celery-demo")
client = APIClient()
client.force_authenticate(user)
body = {"image": "worker-base:2025.11", "cpu": 2, "memory_gb": 4, "labels": {}}
key = str(uuid.uuid4())
for _ in range(3):  # a retry storm of three: one worker, one notice
    response = client.post("/v1/workers", body, format="json", HTTP_IDEMPOTENCY_KEY=key,
                           HTTP_HOST="127.0.0.1")
    assert response.status_code == 201, response.content
print("WORKER", response.json()["id"])
"""

DECLARE = """
from leasebroker.celery import app
with app.connection_for_write() as connection:
    app.amqp.queues[app.conf.task_default_queue](connection.default_channel).declare()
"""


def test_celery_worker_on_the_filesystem_broker_delivers_the_outbox(tmp_path: Path) -> None:
    import celery  # noqa: F401  # declared by the test extra: missing is a failure, not a skip

    database_url = sqlite_url(tmp_path)
    notices = tmp_path / "notifications.jsonl"
    extra = {
        "LEASEBROKER_BROKER_DIR": str(tmp_path / "broker"),
        "LEASEBROKER_NOTIFICATIONS": str(notices),
        "LEASEBROKER_HYPERVISOR_DB": str(tmp_path / "hypervisor.sqlite3"),
    }
    os.environ.update(extra)
    try:
        code, output = run_in_example(["manage.py", "migrate", "--noinput"], database_url)
        assert code == 0, output
        code, output = run_in_example(["manage.py", "shell", "-c", PROVISION], database_url)
        assert code == 0, output
        worker_id = output.split("WORKER", 1)[1].split()[0]
        assert not notices.exists()  # nothing is delivered before a relay runs
        # kombu's filesystem transport makes an exchange's table on the first bind; two
        # processes binding at once (the worker and its beat) can read it empty. Bind
        # the default queue once, in one process, before they start.
        code, output = run_in_example(["manage.py", "shell", "-c", DECLARE], database_url)
        assert code == 0, output

        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="leasebroker.settings")
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "leasebroker", "worker", "--beat",
             "--pool", "solo", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "beat-schedule")],
            cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        # Block on the worker's log until a relay run succeeds (no polling); a watchdog
        # ends a worker that never gets there, which ends the loop too.
        watchdog = threading.Timer(60, os.killpg, (worker.pid, signal.SIGKILL))
        watchdog.start()
        log_lines: list[str] = []
        try:
            assert worker.stdout is not None
            for line in worker.stdout:
                log_lines.append(line)
                if "django_idempotency.relay_outbox" in line and "succeeded" in line:
                    break
        finally:
            watchdog.cancel()
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                rest, _ = worker.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                rest, _ = worker.communicate()
        log = "".join(log_lines) + (rest or "")
        assert notices.exists(), log
        lines = [json.loads(line) for line in notices.read_text().splitlines()]
        assert len(lines) == 1, lines
        assert lines[0]["worker"] == worker_id and lines[0]["dedup_key"].startswith("idk_")
    finally:
        for name in extra:
            os.environ.pop(name, None)
