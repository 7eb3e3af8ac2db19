"""gunicorn in a subprocess on a socket the test bound first.

The test binds and listens, then hands the socket to gunicorn (``--bind fd://``):
requests sent before gunicorn accepts wait in the backlog, so nothing polls for
readiness.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


class Gunicorn:
    """One gunicorn worker with ``threads`` threads serving the WSGI module ``app``.

    Args:
        app: the WSGI application's module (``"leasebroker.wsgi"``).
        cwd: the folder gunicorn runs in (its imports start there).
        log: a file for gunicorn's output.
        threads: threads of its one worker.
    """

    def __init__(self, app: str, *, cwd: Path, log: Path, threads: int = 8) -> None:
        self.app, self.cwd, self.log, self.threads = app, cwd, log, threads
        self.process: subprocess.Popen[bytes] | None = None
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def start(self, env: dict[str, str]) -> None:
        """Start gunicorn with ``env``; it serves the listening socket."""
        fd = self.listener.fileno()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", self.app,
                    "--bind", f"fd://{fd}", "--workers", "1", "--threads", str(self.threads),
                ],
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,),
            )  # fmt: skip

    def stop(self) -> None:
        """Stop gunicorn (SIGTERM, then SIGKILL after 10 s) and close the socket."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.listener.close()
