"""The storm's server side: a throwaway PostgreSQL database and leasebroker on gunicorn.

* :class:`ThrowawayDatabase` creates ``leasebroker_storm_<random>`` on the server of
  an admin URL and drops it (``WITH (FORCE)``) afterwards.
* :class:`Gunicorn` runs leasebroker with several sync worker processes on 127.0.0.1
  and can find, from PostgreSQL's side, the worker process that is in the middle of
  a request (to kill it with SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

EXAMPLE = Path(__file__).resolve().parent.parent
#: Seconds gunicorn may take to answer before the storm gives up: a deadline for a
#: server that never comes up, not a wait (readiness is polled; a loaded machine takes
#: as long as it takes below it). ``STORM_READY_TIMEOUT`` sets it.
READY_TIMEOUT = float(os.environ.get("STORM_READY_TIMEOUT", "300"))


class SetupError(Exception):
    """The database or the server could not be prepared; the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shown_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


class ThrowawayDatabase:
    """A fresh database next to the one ``admin_url`` names; ``url`` points at it."""

    def __init__(self, admin_url: str) -> None:
        parts = urlsplit(admin_url)
        if parts.scheme not in ("postgres", "postgresql"):
            raise SetupError(f"--database-url must be a postgres:// URL, not {admin_url!r}")
        if parts.hostname not in ("127.0.0.1", "localhost", "::1", None):
            raise SetupError("the storm runs on loopback only: use a 127.0.0.1 database")
        self.admin_url = admin_url
        self.name = f"leasebroker_storm_{uuid.uuid4().hex[:10]}"
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))

    def create(self) -> None:
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{self.name}"')
        except psycopg.Error as exc:
            raise SetupError(
                f"cannot create a database on {shown_url(self.admin_url)}: {exc}"
            ) from exc

    def drop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=True)


def manage(env: dict[str, str], *command: str) -> str:
    """Run ``manage.py <command>`` in example_project/; return its output.

    Raises:
        SetupError: the command failed (its last lines are in the message).
    """
    done = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SetupError(f"manage.py {' '.join(command)} failed:\n{output}")
    return done.stdout


class Gunicorn:
    """leasebroker under gunicorn: ``workers`` sync processes on 127.0.0.1:``port``."""

    #: What :meth:`start` polls until the server answers.
    ready_path = "/v1/workers"

    def __init__(self, env: dict[str, str], *, workers: int, port: int | None = None) -> None:
        self.env = env
        self.workers = workers
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="leasebroker-storm-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "gunicorn", "leasebroker.wsgi:application"),
            *("--bind", f"127.0.0.1:{self.port}", "--workers", str(self.workers)),
            *("--worker-class", "sync", "--timeout", "60", "--graceful-timeout", "5"),
        ]

    def start(self, token: str) -> None:
        """Start gunicorn and wait until it answers (``GET ready_path`` as ``token``).

        Raises:
            SetupError: gunicorn is missing, exited, or did not answer in time.
        """
        try:
            import gunicorn  # noqa: F401
        except ImportError:
            raise SetupError("gunicorn is not installed: pip install gunicorn") from None
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=EXAMPLE, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        headers = {"Authorization": f"Token {token}"}
        process = self.process

        def probe() -> str | None:
            if process.poll() is not None:
                raise SetupError(f"gunicorn exited with code {process.returncode}")
            try:
                answer = httpx.get(f"{self.url}{self.ready_path}", headers=headers, timeout=10)
            except httpx.TransportError as exc:
                return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if not answer.is_success:
                return f"HTTP {answer.status_code}"
            workers = len(self.worker_pids())
            if workers < self.workers:
                return f"{workers} of {self.workers} workers up"
            return None

        wait_ready(probe, timeout=READY_TIMEOUT, what="gunicorn")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def worker_pids(self) -> list[int]:
        """The pids of gunicorn's worker processes (children of the master)."""
        if self.process is None:
            return []
        return _children(self.process.pid)

    def worker_in_transaction(self, db: ThrowawayDatabase) -> int | None:
        """The worker process whose database session is inside a transaction, if any.

        PostgreSQL shows the client port of each session (``pg_stat_activity``); the
        worker whose TCP socket has that local port (``/proc/<pid>/fd`` and
        ``/proc/net/tcp``) is the one running the request.
        """
        with db.connect() as conn:
            ports = {
                int(row[0])
                for row in conn.execute(
                    "SELECT client_port FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
                    " AND client_port IS NOT NULL"
                )
            }
        if not ports:
            return None
        for pid in self.worker_pids():
            if _local_ports(pid) & ports:
                return pid
        return None


def wait_ready(probe: Callable[[], str | None], *, timeout: float, what: str) -> float:
    """Poll ``probe`` until it reports ready (``None``); return the seconds it took.

    ``probe`` returns why it is not ready yet, or raises ``SetupError`` when it never
    will be (the process exited). ``timeout`` bounds a server that never comes up; a
    slow one is waited for as long as it needs below it.

    Raises:
        SetupError: not ready after ``timeout`` seconds (the last reason is given).
    """
    started = time.monotonic()
    while True:
        reason = probe() or ""
        if not reason:
            return time.monotonic() - started
        if time.monotonic() - started >= timeout:
            raise SetupError(f"{what} was not ready after {timeout:.0f} s (last: {reason})")
        time.sleep(0.1)


def _children(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(parent):
            pids.append(int(entry))
    return sorted(pids)


def _local_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds (Linux ``/proc``)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def kill(pid: int) -> None:
    """SIGKILL ``pid``: no cleanup, no goodbye, like an OOM kill or a power cut."""
    os.kill(pid, signal.SIGKILL)
