#!/usr/bin/env python
"""leasebroker demo: django-idempotency seen from a client, over real HTTP.

What it does:
  1. ``manage.py migrate`` and ``manage.py create_demo_principals`` (alice and bob);
  2. starts the leasebroker server on 127.0.0.1 (threaded ``runserver``, or gunicorn);
  3. runs a scripted client (demo_client.py) that retries, races and reuses keys,
     printing each request and response and checking what the library promises;
     then the outbox relay delivers a webhook to the example's own receiver, is killed
     before marking it sent and redelivers it: the receiver records it once;
  4. prints a summary and stops the server, even when something failed.

Exit code: 0 if every check held, 1 if a check failed, 2 if the server could not be
set up. Run ``python demo.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from demo_client import Check, Demo
from workers.demo_principals import DEMO_TOKENS

HERE = Path(__file__).resolve().parent
READY_TIMEOUT = 30.0  # seconds to wait for the server to answer


class SetupError(Exception):
    """The server could not be prepared or started; the message says why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--port", type=int, default=0, help="port to serve on (default: a free one)"
    )
    parser.add_argument(
        "--database-url",
        help="DATABASE_URL for the server, e.g. postgres://postgres@127.0.0.1:5432/leasebroker "
        "(default: $DATABASE_URL, else SQLite in example_project/var/)",
    )
    parser.add_argument(
        "--server",
        choices=["runserver", "gunicorn"],
        default="runserver",
        help="runserver (threaded, the default) or gunicorn (if installed)",
    )
    parser.add_argument(
        "--reboot-seconds",
        type=float,
        default=float(os.environ.get("LEASEBROKER_REBOOT_SECONDS", "1.0")),
        help="how long the fake reboot takes (default 1.0)",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the server up after the checks (Ctrl-C stops it) and print curl examples",
    )
    return parser.parse_args(argv)


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "leasebroker.settings"
    env["LEASEBROKER_REBOOT_SECONDS"] = str(args.reboot_seconds)
    env["PYTHONUNBUFFERED"] = "1"
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    return env


def shown_url(url: str) -> str:
    """A database URL with its password hidden."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def manage(env: dict[str, str], *command: str) -> str:
    """Run ``manage.py <command>``; return its output.

    Raises:
        SetupError: the command failed (its output is in the message).
    """
    done = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SetupError(f"manage.py {' '.join(command)} failed; its last lines:\n{output}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """The leasebroker server as a child process, its output in a log file."""

    def __init__(self, kind: str, port: int, env: dict[str, str]) -> None:
        self.kind = kind
        self.port = port
        self.env = env
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = Path(tempfile.mkstemp(prefix="leasebroker-server-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        address = f"127.0.0.1:{self.port}"
        if self.kind == "gunicorn":
            # Two processes of four threads: duplicates may land in either.
            return [
                *(sys.executable, "-m", "gunicorn", "leasebroker.wsgi:application"),
                *("--bind", address, "--workers", "2", "--threads", "4"),
                *("--access-logfile", "-"),
            ]
        # Threaded (no --nothreading): concurrent requests are served concurrently.
        return [sys.executable, "manage.py", "runserver", "--noreload", address]

    def start(self) -> None:
        if self.kind == "gunicorn":
            try:
                import gunicorn  # noqa: F401
            except ImportError:
                raise SetupError("--server gunicorn: pip install gunicorn first") from None
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=HERE, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def wait_ready(self, token: str, timeout: float = READY_TIMEOUT) -> None:
        """Poll ``GET /v1/workers`` until it answers 200.

        Raises:
            SetupError: the server exited or did not answer within ``timeout`` seconds.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Token {token}"}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SetupError(f"the server exited with code {self.process.returncode}")
            try:
                if httpx.get(f"{self.base_url}/v1/workers", headers=headers, timeout=2).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise SetupError(f"the server did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        """Terminate the server; kill it if it does not stop within 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def webhook_redelivery(demo: Demo, env: dict[str, str], base_url: str) -> None:
    """The outbox relay delivers worker.provisioned to POST /hooks/billing, and redelivers.

    ``manage.py relay_and_crash`` delivers a notice and dies (SIGKILL) before marking
    it sent; after its 1 s lease, ``manage.py idempotency_relay --once`` delivers the
    same message again, same dedup key. The receiver takes the dedup key as its
    idempotency key: one billing event per notice, the second delivery a replay.
    """
    relay_env = {**env, "LEASEBROKER_BILLING_URL": f"{base_url}/hooks/billing"}
    demo.heading("the relay redelivers a webhook; the receiver records it once")
    crashed = subprocess.run(
        [sys.executable, "manage.py", "relay_and_crash", "--lease", "1"],
        cwd=HERE, env=relay_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = crashed.stdout.strip().splitlines()
    print(f"  relay 1 -> {said[-1] if said else '(no output)'}  (exit {crashed.returncode})")
    demo.check("the first relay died after delivering", crashed.returncode == -signal.SIGKILL,
               f"exit {crashed.returncode}: {crashed.stderr[-300:]}")  # fmt: skip
    dedup_key = said[-1].split()[1] if said and said[-1].startswith("delivered ") else ""
    status: list[dict[str, object]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the first relay's lease ends after 1 s
        manage(relay_env, "idempotency_relay", "--once")
        status = json.loads(manage(relay_env, "billing_status"))
        mine = [m for m in status if m["dedup_key"] == dedup_key]
        if mine and mine[0]["state"] == "sent":
            break
        time.sleep(0.5)
    mine = [m for m in status if m["dedup_key"] == dedup_key]
    print(f"  relay 2 -> {json.dumps(mine[0]) if mine else '(message not found)'}")
    demo.check("the second relay delivered the same message again",
               bool(mine) and mine[0]["state"] == "sent" and mine[0]["attempts"] == 2,
               f"{mine}")  # fmt: skip
    demo.check("the receiver recorded its billing event once",
               bool(mine) and mine[0]["billing_events"] == 1, f"{mine}")  # fmt: skip
    sent = [m for m in status if m["state"] == "sent"]
    demo.check("every delivered notice has exactly one billing event",
               all(m["billing_events"] == 1 for m in sent), f"{sent}")  # fmt: skip


def print_summary(checks: list[Check]) -> bool:
    print("")
    print("== Summary ".ljust(78, "="))
    width = max((len(c.name) for c in checks), default=10)
    for number, check in enumerate(checks, 1):
        result = "ok" if check.ok else "FAIL"
        print(f"  {number:>2}  step {check.step}  {check.name:<{width}}  {result}")
    failed = [c for c in checks if not c.ok]
    print("")
    if failed:
        print(f"{len(failed)} of {len(checks)} checks FAILED:")
        for check in failed:
            print(f"  - step {check.step}: {check.name}: {check.detail}")
        return False
    print(f"all {len(checks)} checks passed")
    return True


def print_curl_examples(base_url: str) -> None:
    alice = DEMO_TOKENS["alice"]
    body = '{"image": "ubuntu-24.04", "cpu": 2, "memory_gb": 4}'
    print("")
    print(f"The server is still running at {base_url}. Try (run the POST twice):")
    print(f'  curl -i {base_url}/v1/workers -H "Authorization: Token {alice}"')
    print(
        f'  curl -i -X POST {base_url}/v1/workers -H "Authorization: Token {alice}" \\\n'
        f'       -H "Idempotency-Key: my-first-key" -H "Content-Type: application/json" \\\n'
        f"       -d '{body}'"
    )
    print(f"bob's token: {DEMO_TOKENS['bob']}.  Press Ctrl-C to stop the server.")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally: the server stops


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    env = server_env(args)
    database = env.get("DATABASE_URL") or "sqlite (example_project/var/leasebroker.sqlite3)"
    print("leasebroker demo: retries, races and reused keys against django-idempotency")
    print(f"  database: {shown_url(database)}")
    server = Server(args.server, args.port or free_port(), env)
    keep_log = True
    try:
        print("  preparing: manage.py migrate, manage.py create_demo_principals")
        manage(env, "migrate", "--noinput", "-v", "0")
        for line in manage(env, "create_demo_principals").splitlines():
            print(f"    {line}")
        print(f"  starting: python {' '.join(server.command()[1:])}")
        server.start()
        server.wait_ready(DEMO_TOKENS["alice"])
        print(f"  server ready at {server.base_url}")
        demo = Demo(server.base_url, DEMO_TOKENS, reboot_seconds=args.reboot_seconds)
        try:
            checks = demo.run_all()
            webhook_redelivery(demo, env, server.base_url)
        finally:
            demo.close()
        passed = print_summary(checks)
        if not passed:
            print(f"\nLast lines of the server log ({server.log}):\n{server.tail()}")
        keep_log = not passed or args.keep_running
        if args.keep_running:
            print_curl_examples(server.base_url)
            print(f"The server's log: {server.log}")
            try:
                assert server.process is not None
                server.process.wait()
            except KeyboardInterrupt:
                print("\nstopping the server")
        return 0 if passed else 1
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the server")
        return 130
    except (SetupError, httpx.HTTPError, subprocess.TimeoutExpired) as exc:
        print(f"\nDEMO FAILED: {exc}")
        if server.process is not None:
            print(f"\nLast lines of the server log ({server.log}):\n{server.tail()}")
        return 2
    finally:
        server.stop()
        if not keep_log:
            server.log.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
