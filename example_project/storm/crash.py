"""Crash mid-flight: SIGKILL the gunicorn worker running a create, and watch the retry.

The server runs with a slow boot (``LEASEBROKER_BOOT_SECONDS``) and a short
idempotency lease (``LEASEBROKER_IDEMPOTENCY_LEASE``). A client sends one create.
Once PostgreSQL shows that request's session inside its transaction (the claim has
committed, the worker row is written but not committed, the boot is under way), the
worker process serving it is killed with SIGKILL. Its transaction dies with it; the
claim stays, with a live lease. The client sees the connection reset and retries with
the same key: 409 ``request-in-flight`` (honouring ``Retry-After``) until the lease
runs out, then its retry takes the claim over, runs the view once more and gets 201.
One operation, one worker.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from django_idempotency.client import AttemptEvent, Backoff, IdempotentClient

from .clients import CREATE, count_workers
from .server import Gunicorn, ThrowawayDatabase, kill

#: Seconds at most to see the request inside its transaction; the search also ends as
#: soon as the client's thread does (it has its own total timeout). A bound, not a wait.
FIND_TIMEOUT = 120.0


@dataclass
class CrashReport:
    killed_pid: int | None = None
    workers_before: list[int] = field(default_factory=list)
    workers_after: list[int] = field(default_factory=list)
    events: list[AttemptEvent] = field(default_factory=list)
    response: httpx.Response | None = None
    error: Exception | None = None
    workers_created: int = 0
    record_state: str = ""
    seconds: float = 0.0
    #: Seconds from the SIGKILL to the client's 201 (the retry's takeover plus one run).
    recovery: float | None = None

    @property
    def ok(self) -> bool:
        return (
            self.killed_pid is not None
            and self.response is not None
            and self.response.status_code == 201
            and self.workers_created == 1
            and self.record_state == "completed"
        )


def crash_mid_flight(
    server: Gunicorn,
    db: ThrowawayDatabase,
    *,
    token: str,
    run_id: str,
    boot_seconds: float,
    lease: float,
) -> CrashReport:
    """Run the scenario; never raises for a failed expectation (see ``CrashReport.ok``)."""
    report = CrashReport(workers_before=server.worker_pids())
    key = f"{run_id}-crash"
    body: dict[str, Any] = {
        "image": "ubuntu-24.04",
        "cpu": 1,
        "memory_gb": 1,
        "labels": {"storm-run": run_id, "op": "crash"},
    }
    client = IdempotentClient(
        server.url,
        headers={"Authorization": f"Token {token}"},
        attempts=40,
        timeout=boot_seconds + 10.0,
        total_timeout=lease + 4 * boot_seconds + 30.0,
        backoff=Backoff(initial=0.1, maximum=1.0),
        on_attempt=report.events.append,
    )
    started = time.monotonic()

    killed_at: list[float] = []

    def send() -> None:
        try:
            report.response = client.post(CREATE, json=body, key=key)
        except Exception as exc:  # reported, not raised: the demo prints it
            report.error = exc
        if killed_at:
            report.recovery = time.monotonic() - killed_at[0]

    thread = threading.Thread(target=send, name="crash-client")
    thread.start()
    try:
        deadline = time.monotonic() + FIND_TIMEOUT
        while report.killed_pid is None and time.monotonic() < deadline and thread.is_alive():
            pid = server.worker_in_transaction(db)
            if pid is not None:
                kill(pid)
                killed_at.append(time.monotonic())
                report.killed_pid = pid
            else:
                time.sleep(0.02)
        thread.join(timeout=lease + 4 * boot_seconds + 60.0)
    finally:
        client.close()
    report.seconds = time.monotonic() - started
    report.workers_after = server.worker_pids()
    report.workers_created = sum(count_workers(db.connect, run_id).values())
    with db.connect() as conn:
        row = conn.execute(
            "SELECT state FROM django_idempotency_record WHERE key = %s", (key,)
        ).fetchone()
    report.record_state = str(row[0]) if row else "(none)"
    return report
