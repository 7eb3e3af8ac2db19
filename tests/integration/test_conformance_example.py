"""The conformance check passes against the example project, served as a user serves it.

leasebroker runs under gunicorn (one process, eight threads) on a fresh SQLite file;
the check talks to it over real HTTP: the command line against ``POST /v1/workers``
(alice, with bob as the second principal, her worker list as the effect counter), and
the test assertion against the slow ``POST /v1/workers/<id>/reboot``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from django_idempotency.conformance import assert_conforms
from tests.support.example_project import EXAMPLE, run_in_example, sqlite_url
from tests.support.gunicorn import Gunicorn

ALICE = "Authorization: Token alice-demo-token-" + "0" * 23
BOB = "Authorization: Token bob-demo-token-" + "0" * 25
REBOOT_SECONDS = 1.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def leasebroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example project's base URL, on a fresh SQLite database."""
    tmp = tmp_path_factory.mktemp("conformance-example")
    database_url = sqlite_url(tmp)
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
        yield server.url
    finally:
        server.stop()


def test_the_example_project_passes_the_command_line_check(
    leasebroker: str, tmp_path: Path
) -> None:
    report_file = tmp_path / "report.json"
    body = json.dumps({"image": "ubuntu-24.04", "cpu": 2, "memory_gb": 4})
    done = subprocess.run(
        [
            *(sys.executable, "-m", "django_idempotency.conformance"),
            f"{leasebroker}/v1/workers",
            *("--json", body, "-H", ALICE, "--other-principal-header", BOB),
            *("--effect-url", f"{leasebroker}/v1/workers", "-n", "10"),
            *("--json-report", str(report_file)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_file.read_text())
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert report["passed"] and report["exit_code"] == 0
    assert set(verdicts.values()) == {"pass", "skip"}, done.stdout
    assert verdicts["concurrent-effects"] == verdicts["replay-effects"] == "pass"
    assert verdicts["principal-scoping"] == verdicts["key-reused"] == "pass"
    assert verdicts["replay-per-exchange"] == "pass"  # Date is the replay's own
    assert verdicts["in-flight"] == "skip"  # no slow handler given
    assert "fail" not in done.stdout.splitlines()[-1], done.stdout


def test_the_example_projects_slow_reboot_answers_a_duplicate_in_flight_with_409(
    leasebroker: str,
) -> None:
    auth = dict([ALICE.split(": ", 1)])
    created = httpx.post(
        f"{leasebroker}/v1/workers",
        json={"image": "ubuntu-24.04", "cpu": 1, "memory_gb": 1},
        headers={**auth, "Idempotency-Key": "conformance-example-worker"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    worker = f"{leasebroker}/v1/workers/{created.json()['id']}"

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
    )

    assert report.result("in-flight").verdict == "pass", report.table()
    assert report.result("retry-after-on-409").verdict == "pass", report.table()
    assert report.result("concurrent-effects").verdict == "pass", report.table()
    assert httpx.get(worker, headers=auth, timeout=10).json()["reboots"] == 3
