"""The conformance check passes against the example project, served as a user serves it.

leasebroker runs under gunicorn (one process, eight threads) on a fresh SQLite file, and
on a fresh PostgreSQL database when the suite runs on PostgreSQL (where duplicates meet
the committed claim and get 409 rather than queue behind a write lock). The check talks
to it over real HTTP: the command line against ``POST /v1/workers``
(alice, with bob as the second principal, her worker list as the effect counter), and
the test assertion against the slow ``POST /v1/workers/<id>/reboot``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import django
import httpx
import pytest
from django.conf import settings

from django_idempotency.conformance import assert_conforms
from tests.support.example_project import EXAMPLE, run_in_example, sqlite_url
from tests.support.gunicorn import Gunicorn

ALICE = "Authorization: Token alice-demo-token-" + "0" * 23
BOB = "Authorization: Token bob-demo-token-" + "0" * 25
REBOOT_SECONDS = 1.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Leasebroker:
    url: str
    log: Path
    database: str  # "sqlite" or "postgres"

    def tail(self) -> str:
        """The end of the server's log, for a failure's message."""
        return "\nserver log:\n" + self.log.read_text(errors="replace")[-4000:]


@contextmanager
def fresh_database(kind: str, tmp: Path) -> Iterator[str]:
    """A new, empty database of ``kind`` (``"sqlite"`` or ``"postgres"``); its URL."""
    if kind == "sqlite":
        yield sqlite_url(tmp)
        return
    import psycopg

    db = settings.DATABASES["default"]
    params = {
        "host": db.get("HOST") or "127.0.0.1",
        "port": str(db.get("PORT") or 5432),
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or "",
    }
    name = f"leasebroker_conformance_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    credentials = quote(params["user"], safe="")
    if params["password"]:
        credentials += ":" + quote(params["password"], safe="")
    try:
        yield f"postgres://{credentials}@{params['host']}:{params['port']}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def leasebroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Leasebroker]:
    """The example project's base URL, on a fresh database."""
    tmp = tmp_path_factory.mktemp("conformance-example")
    with fresh_database(request.param, tmp) as database_url:
        yield from _serve(database_url, tmp, request.param)


def _serve(database_url: str, tmp: Path, database: str) -> Iterator[Leasebroker]:
    for command in (
        ["manage.py", "migrate", "--noinput", "-v", "0"],
        ["manage.py", "create_demo_principals"],
    ):
        code, output = run_in_example(command, database_url)
        assert code == 0, output
    log = tmp / "server.log"
    server = Gunicorn("leasebroker.wsgi", cwd=EXAMPLE, log=log)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="leasebroker.settings",
        LEASEBROKER_REBOOT_SECONDS=str(REBOOT_SECONDS),
        DEBUG="false",
    )
    server.start(env)
    try:
        yield Leasebroker(server.url, log, database)
    finally:
        server.stop()


def test_the_example_project_passes_the_command_line_check(
    leasebroker: Leasebroker, tmp_path: Path
) -> None:
    report_file = tmp_path / "report.json"
    body = json.dumps({"image": "ubuntu-24.04", "cpu": 2, "memory_gb": 4})
    done = subprocess.run(
        [
            *(sys.executable, "-m", "django_idempotency.conformance"),
            f"{leasebroker.url}/v1/workers",
            *("--json", body, "-H", ALICE, "--other-principal-header", BOB),
            *("--effect-url", f"{leasebroker.url}/v1/workers", "-n", "10"),
            *("--timeout", "60", "--time-budget", "300"),  # a loaded CI machine
            *("--json-report", str(report_file)),
        ],
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
        cwd=ROOT,
    )

    assert report_file.is_file(), done.stdout + done.stderr + leasebroker.tail()
    report = json.loads(report_file.read_text())
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    if leasebroker.database == "sqlite" and django.VERSION < (5, 1):
        # Without transaction_mode="IMMEDIATE" (Django 5.1+), a view's transaction that
        # reads before it writes cannot wait for SQLite's one write lock: when a duplicate
        # that looked while the original's claim was being written inserts its own claim,
        # the original's next write fails at once with "database is locked"
        # (docs/storage.md#sqlite). The worker is still created once.
        duplicates = verdicts.pop("concurrent-duplicates")
        assert duplicates in ("pass", "warn", "fail"), done.stdout
        assert done.returncode == (duplicates == "fail"), done.stdout + leasebroker.tail()
    else:
        assert done.returncode == 0, done.stdout + done.stderr + leasebroker.tail()
        assert report["passed"] and report["exit_code"] == 0
        assert "fail" not in done.stdout.splitlines()[-1], done.stdout
    assert set(verdicts.values()) == {"pass", "skip"}, done.stdout
    assert verdicts["concurrent-effects"] == verdicts["replay-effects"] == "pass"
    assert verdicts["principal-scoping"] == verdicts["key-reused"] == "pass"
    assert verdicts["replay-per-exchange"] == "pass"  # Date is the replay's own
    assert verdicts["in-flight"] == "skip"  # no slow handler given


def test_the_example_projects_slow_reboot_answers_a_duplicate_in_flight_with_409(
    leasebroker: Leasebroker,
) -> None:
    auth = dict([ALICE.split(": ", 1)])
    created = httpx.post(
        f"{leasebroker.url}/v1/workers",
        json={"image": "ubuntu-24.04", "cpu": 1, "memory_gb": 1},
        headers={**auth, "Idempotency-Key": "conformance-example-worker"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    worker = f"{leasebroker.url}/v1/workers/{created.json()['id']}"

    report = assert_conforms(
        f"{worker}/reboot",
        headers=auth,
        other_headers=dict([BOB.split(": ", 1)]),
        effect_url=worker,
        effect_field="reboots",
        concurrency=5,
        slow_query="",
        in_flight_delay=REBOOT_SECONDS / 3,
        replay_delay=0.0,
        safe_method="",
        timeout=60.0,
        time_budget=300.0,
    )

    assert report.result("in-flight").verdict == "pass", report.table()
    assert report.result("retry-after-on-409").verdict == "pass", report.table()
    assert report.result("concurrent-effects").verdict == "pass", report.table()
    assert httpx.get(worker, headers=auth, timeout=10).json()["reboots"] == 3
