"""schemathesis against the example project's OpenAPI schema, over real HTTP.

The example project (leasebroker) runs unchanged under a settings module that extends
its own with drf-spectacular and ``django_idempotency.contrib.openapi.IdempotentAutoSchema``,
so every idempotent operation declares the ``Idempotency-Key`` header. schemathesis
then generates valid and invalid requests (headers included: empty, huge, control
characters, NUL bytes) for every operation, and its ``not_a_server_error`` check
fails on any 5xx. SQLite: the fuzz is about input handling, not storage.

Skipped when schemathesis or drf-spectacular is not installed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import drf_spectacular  # noqa: F401
import httpx
import pytest
import schemathesis  # noqa: F401  # declared by the test extra: missing is a failure, not a skip

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
TOKEN = "alice-demo-token-00000000000000000000000"  # workers/demo_principals.py

SETTINGS = """
from leasebroker.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "drf_spectacular"]  # noqa: F405
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_SCHEMA_CLASS": "django_idempotency.contrib.openapi.IdempotentAutoSchema",
}
SPECTACULAR_SETTINGS = {"SERVE_INCLUDE_SCHEMA": False}
ROOT_URLCONF = "schema_urls"
DEBUG = False
SILENCED_SYSTEM_CHECKS = ["django_idempotency.W003", "django_idempotency.W004"]
"""
URLS = """
from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from leasebroker.urls import urlpatterns as base

schema = SpectacularAPIView.as_view(permission_classes=[AllowAny], authentication_classes=[])
urlpatterns = [*base, path("schema/", schema)]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def example_server(tmp_path: Path) -> Iterator[str]:
    """The example project on ``runserver`` in its own process group; its base URL."""
    (tmp_path / "schema_settings.py").write_text(SETTINGS)
    (tmp_path / "schema_urls.py").write_text(URLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLE), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "schema_settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'leasebroker.sqlite3'}",
        "LEASEBROKER_REBOOT_SECONDS": "0",
    }

    def manage(*args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=EXAMPLE,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    manage("migrate", "--noinput", "-v", "0")
    manage("create_demo_principals")
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=EXAMPLE,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline, pause = time.monotonic() + 60, threading.Event()
        while True:  # poll until the server answers (a condition, not a delay)
            try:
                if httpx.get(f"{base_url}/schema/", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the example server did not start"
            pause.wait(0.1)
        yield base_url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        log.close()
        server_log = (tmp_path / "server.log").read_text()
        assert "Traceback" not in server_log, server_log[-5000:]


def test_no_generated_request_gets_a_server_error(example_server: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{example_server}/schema/",
            "--header",
            f"Authorization: Token {TOKEN}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "20",
            "--seed",
            "20261129",
            "--generation-database",
            "none",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "No issues found" in output, output[-8000:]
    assert "Idempotency-Key" in httpx.get(f"{example_server}/schema/").text
