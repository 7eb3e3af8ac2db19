"""The storm's clients: many threads creating workers through the fault proxy.

Each *logical operation* is "create worker number N of this run" (``POST /v1/workers``
with the labels ``storm-run`` and ``op``). Two client kinds run the same operations:

* idempotency on: ``IdempotentClient`` with a shared ``SQLiteKeyStore``; one key per
  operation, minted before the first attempt, reused by every retry, by the twin of a
  duplicated job and by the client that replaces a crashed one.
* idempotency off: :class:`KeyPerAttemptClient`, the same client and the same retries
  but a fresh key on every attempt. From the server's side that is exactly a client
  without idempotency keys (the server cannot link two attempts), and the server and
  its settings stay the same for both runs.

Three kinds of operation: ``plain``; ``restart`` (the client's process "dies" after
its first attempt, whose answer the proxy drops after the view committed, and a new
client object with the same key store takes over); ``twin`` (two threads run the
same job at once, as two queue consumers that both picked it up).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import stamina

from django_idempotency.client import (
    AttemptEvent,
    Backoff,
    IdempotentClient,
    IdempotentRequestError,
    RetriesExhausted,
    SQLiteKeyStore,
)

Kind = Literal["plain", "restart", "twin"]
Mode = Literal["on", "off"]
CREATE = "/v1/workers"
BACKOFF = Backoff(initial=0.05, maximum=1.0, max_retry_after=5.0)


@dataclass(frozen=True)
class Job:
    """One unit of work for a client thread: operation ``number`` of kind ``kind``."""

    number: int
    kind: Kind


def plan(operations: int) -> list[Job]:
    """The jobs: every 10th operation (from the 4th) restarts, every 10th (from the 8th)
    is a twin (two jobs); the rest are plain. Deterministic, so runs compare."""
    jobs: list[Job] = []
    for number in range(operations):
        kind: Kind = "restart" if number % 10 == 3 else "twin" if number % 10 == 7 else "plain"
        jobs.append(Job(number, kind))
        if kind == "twin":
            jobs.append(Job(number, kind))
    return jobs


@dataclass
class Tally:
    """What the clients saw, counted from ``AttemptEvent``s. Thread-safe."""

    attempts: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    replays: int = 0
    conflicts: int = 0
    network_errors: int = 0
    failed: list[str] = field(default_factory=list)
    #: Clients that gave up (their retries exhausted), per operation number.
    gave_up: Counter[int] = field(default_factory=Counter)
    answers: dict[int, set[str]] = field(default_factory=dict)
    #: Answers to the clients that resumed an operation whose clients all gave up.
    resumed: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, event: AttemptEvent) -> None:
        with self._lock:
            self.attempts += 1
            if event.status is None:
                self.network_errors += 1
                self.statuses[type(event.error).__name__] += 1
                return
            self.statuses[str(event.status)] += 1
            self.replays += event.replayed
            self.conflicts += event.status == 409

    def answered(self, number: int, worker_id: str) -> None:
        with self._lock:
            self.answers.setdefault(number, set()).add(worker_id)

    def fail(self, number: int, text: str) -> None:
        with self._lock:
            self.failed.append(text)
            self.gave_up[number] += 1

    def abandoned(self) -> list[int]:
        """Operations no client got an answer for: every client of it gave up."""
        with self._lock:
            return sorted(n for n in self.gave_up if n not in self.answers)


class Poster(Protocol):
    def post(self, path: str, **kwargs: Any) -> httpx.Response: ...

    def close(self) -> None: ...


class KeyPerAttemptClient:
    """Idempotency off: stamina retries, but every attempt mints a new key.

    It wraps a one-attempt ``IdempotentClient`` called without an operation name, so
    each call sends a fresh key; the retry loop around it is stamina's, on the same
    errors. The server cannot tell a retry from a new request.
    """

    def __init__(self, attempts: int, **kwargs: Any) -> None:
        self.attempts = attempts
        self.single = IdempotentClient(attempts=1, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("operation", None)
        for attempt in stamina.retry_context(
            on=RetriesExhausted,
            attempts=self.attempts,
            timeout=60.0,
            wait_initial=BACKOFF.initial,
            wait_max=BACKOFF.maximum,
            wait_jitter=BACKOFF.initial,
        ):
            with attempt:
                return self.single.post(path, **kwargs)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.single.close()


@dataclass
class Storm:
    """Run ``jobs`` on ``threads`` threads against ``base_url`` in ``mode``."""

    base_url: str
    token: str
    run_id: str
    mode: Mode
    key_store: Path
    timeout: float
    attempts: int = 10
    threads: int = 16
    tally: Tally = field(default_factory=Tally)

    def client(self, attempts: int | None = None) -> Poster:
        options: dict[str, Any] = {
            "headers": {"Authorization": f"Token {self.token}"},
            "timeout": self.timeout,
            "total_timeout": 60.0,
            "backoff": BACKOFF,
            "on_attempt": self.tally.record,
        }
        if self.mode == "off":
            return KeyPerAttemptClient(attempts or self.attempts, base_url=self.base_url, **options)
        return IdempotentClient(
            self.base_url,
            attempts=attempts or self.attempts,
            key_store=SQLiteKeyStore(self.key_store),
            **options,
        )

    def body(self, number: int) -> dict[str, Any]:
        return {
            "image": "ubuntu-24.04",
            "cpu": 1,
            "memory_gb": 1,
            "labels": {"storm-run": self.run_id, "op": str(number)},
        }

    def run(self, jobs: list[Job]) -> Tally:
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="storm") as pool:
            for _ in pool.map(self.run_job, jobs):
                pass
        return self.tally

    def run_job(self, job: Job) -> None:
        operation = f"{self.run_id}/worker-{job.number}"
        body = self.body(job.number)
        try:
            if job.kind == "restart":
                response = self._crash_then_resume(operation, body)
            else:
                response = self._send(self.client(), operation, body)
        except IdempotentRequestError as exc:
            self.tally.fail(job.number, f"operation {job.number}: {exc}")
            return
        self.tally.answered(job.number, str(response.json().get("id")))

    def resume(self, number: int, base_url: str) -> None:
        """Operation ``number`` taken up again, after its clients gave up, by a new
        client with the same key store, straight to the server (no fault proxy): with
        idempotency it gets the stored answer or runs the operation once."""
        client = IdempotentClient(
            base_url,
            attempts=self.attempts,
            key_store=SQLiteKeyStore(self.key_store),
            headers={"Authorization": f"Token {self.token}"},
            timeout=max(self.timeout, 10.0),
            total_timeout=120.0,
            backoff=BACKOFF,
        )
        try:
            response = client.post(
                CREATE, json=self.body(number), operation=f"{self.run_id}/worker-{number}"
            )
        finally:
            client.close()
        self.tally.resumed[number] = str(response.json().get("id"))

    def _crash_then_resume(self, operation: str, body: dict[str, Any]) -> httpx.Response:
        first = self.client(attempts=1)
        # The proxy runs this attempt and drops its answer; the client gives up and
        # its process "dies" (the object is discarded). The key is on disk.
        with contextlib.suppress(IdempotentRequestError):
            self._send(first, operation, body, headers={"X-Storm-Fault": "drop"})
        return self._send(self.client(), operation, body)

    @staticmethod
    def _send(
        client: Poster,
        operation: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        try:
            return client.post(CREATE, json=body, operation=operation, headers=headers)
        finally:
            client.close()


def count_workers(connect: Callable[[], Any], run_id: str) -> dict[str, int]:
    """Workers in the database per operation number of run ``run_id``."""
    return {op: len(ids) for op, ids in stored_workers(connect, run_id).items()}


def stored_workers(connect: Callable[[], Any], run_id: str) -> dict[str, set[str]]:
    """The ids of the workers in the database per operation number of run ``run_id``."""
    with connect() as conn:
        rows = conn.execute(
            "SELECT labels->>'op', id::text FROM workers_worker WHERE labels->>'storm-run' = %s",
            (run_id,),
        ).fetchall()
    stored: dict[str, set[str]] = {}
    for op, worker_id in rows:
        stored.setdefault(str(op), set()).add(str(worker_id))
    return stored
