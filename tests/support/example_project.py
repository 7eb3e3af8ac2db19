"""The example project (example_project/) run as a user runs it, in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
DEMO_TIMEOUT = 120  # seconds; the demo itself takes a few


def _env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DATABASE_URL"] = database_url
    env["DJANGO_SETTINGS_MODULE"] = "leasebroker.settings"
    return env


def run_in_example(
    args: list[str], database_url: str, timeout: float = DEMO_TIMEOUT
) -> tuple[int, str]:
    """Run ``python <args>`` in example_project/; return (exit code, output).

    The child gets its own process group, so on a timeout the demo *and* the server it
    started are killed (the test fails rather than hangs or leaks a server).
    """
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=EXAMPLE,
        env=_env(database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(args)} did not finish in {timeout} s:\n{output}")
    return process.returncode, output


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leasebroker.sqlite3'}"
