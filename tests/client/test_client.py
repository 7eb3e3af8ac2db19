"""django_idempotency.client: retry decisions (httpx.MockTransport) and real HTTP.

The first part drives the client against an in-process ``httpx.MockTransport``: that
tests the client's own decisions (what it retries, with which key, how long it
waits), not the server. stamina's test mode turns the waits off; the waits the client
computed are still visible in its ``AttemptEvent``s.

The second part starts the example project (leasebroker) on SQLite as a subprocess
and talks to it over real HTTP: replays, 422, a real 409 in flight, a restarted
client reusing its persisted key, and the async client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
import stamina

from django_idempotency.client import (
    RELEASED_4XX,
    AsyncIdempotentClient,
    AttemptEvent,
    Backoff,
    IdempotentClient,
    MemoryKeyStore,
    NonRetryableError,
    ResponseNotReplayable,
    RetriesExhausted,
    SQLiteKeyStore,
    is_replay,
    problem_of,
    retry_after_seconds,
    verdict,
)
from tests.support.example_project import EXAMPLE, run_in_example, sqlite_url
from tests.support.faults import wait_for
from tests.support.gunicorn import Gunicorn
from tests.support.scripted_transport import NO_JITTER, Script, make_client

PROBLEM_BASE = "https://django-idempotency.readthedocs.io/en/stable/problems/#"


@pytest.fixture(autouse=True)
def no_waits() -> Iterator[None]:
    """stamina's test mode: no real sleeping between attempts; attempts not capped."""
    with stamina.set_testing(True, attempts=1000, cap=True):
        yield


def problem(slug: str, status: int, retry_after: int | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"type": PROBLEM_BASE + slug, "title": slug, "status": status, "detail": "d"}
    return httpx.Response(status, headers=headers, content=json.dumps(body).encode())


def created(replayed: bool = False) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Location": "/v1/workers/wkr-1"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return httpx.Response(201, headers=headers, json={"id": "wkr-1"})


# -- what is retried, with which key ---------------------------------------------------


def test_one_key_is_minted_before_the_first_attempt_and_kept_across_retries() -> None:
    script = Script(problem("store-unavailable", 503), httpx.ConnectError("refused"), created())
    events: list[AttemptEvent] = []

    with make_client(script, events) as client:
        response = client.post("/v1/workers", json={"cpu": 2})

    assert response.status_code == 201
    assert len(script.requests) == 3
    assert len(set(script.keys)) == 1 and script.keys[0]
    assert [r.content for r in script.requests] == [b'{"cpu":2}'] * 3
    assert [e.number for e in events] == [1, 2, 3]
    assert [e.verdict for e in events] == ["retry", "retry", "success"]
    assert events[1].status is None and isinstance(events[1].error, httpx.ConnectError)
    assert script.requests[0].headers["Authorization"] == "Token t"


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("timed out"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("connection reset"),
    ],
    ids=["connect", "read-timeout", "disconnected", "reset"],
)
def test_network_errors_are_retried(failure: Exception) -> None:
    script = Script(failure, created(replayed=True))

    with make_client(script) as client:
        response = client.post("/v1/workers", json={})

    assert response.status_code == 201 and is_replay(response)
    assert len(script.requests) == 2 and script.keys[0] == script.keys[1]


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retried(status: int) -> None:
    script = Script(httpx.Response(status), created())

    with make_client(script) as client:
        assert client.post("/x").status_code == 201

    assert len(script.requests) == 2


@pytest.mark.parametrize("slug", ["request-in-flight", "lease-lost"])
def test_409_in_flight_and_lease_lost_are_retried_after_retry_after(slug: str) -> None:
    script = Script(problem(slug, 409, retry_after=2), created(replayed=True))
    events: list[AttemptEvent] = []

    with make_client(script, events) as client:
        response = client.post("/x", json={"a": 1})

    assert is_replay(response)
    assert len(script.requests) == 2 and script.keys[0] == script.keys[1]
    # Retry-After (2 s) plus full jitter of the first step: 0.5 * 0.1.
    assert events[0].status == 409 and events[0].wait == pytest.approx(2.05)
    assert events[1].replayed and events[1].wait is None


def test_a_replay_is_a_success() -> None:
    script = Script(created(replayed=True))

    with make_client(script) as client:
        response = client.post("/x")

    assert response.status_code == 201 and is_replay(response)
    assert len(script.requests) == 1


def test_422_is_never_retried_and_raises_with_the_problem() -> None:
    script = Script(problem("key-reused", 422), created())
    events: list[AttemptEvent] = []

    with make_client(script, events) as client, pytest.raises(NonRetryableError) as caught:
        client.post("/v1/workers", json={"cpu": 4}, operation="op-1")

    error = caught.value
    assert len(script.requests) == 1
    assert error.status == 422 and error.attempts == 1
    assert error.problem is not None and error.problem["type"].endswith("#key-reused")
    assert error.operation == "op-1" and error.key == script.keys[0]
    assert "422" in str(error) and "[key-reused]" in str(error)
    assert [e.verdict for e in events] == ["fail"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 410, 413, 425, 429])
def test_other_4xx_are_not_retried(status: int) -> None:
    script = Script(httpx.Response(status, json={"detail": "no"}), created())

    with make_client(script) as client, pytest.raises(NonRetryableError) as caught:
        client.post("/x")

    assert caught.value.status == status and caught.value.problem is None
    assert len(script.requests) == 1


def test_a_410_not_replayable_says_the_operation_is_done() -> None:
    answer = problem("response-too-large-to-replay", 410)
    body = {**answer.json(), "original_status": 201}
    script = Script(
        httpx.Response(
            410,
            headers={"Content-Type": "application/problem+json", "Location": "/v1/workers/w"},
            json=body,
        )
    )

    with make_client(script) as client, pytest.raises(ResponseNotReplayable) as caught:
        client.post("/x")

    assert isinstance(caught.value, NonRetryableError)
    assert caught.value.original_status == 201
    assert caught.value.response is not None
    assert caught.value.response.headers["Location"] == "/v1/workers/w"
    assert len(script.requests) == 1


def test_released_4xx_can_be_retried_as_a_set() -> None:
    script = Script(httpx.Response(408), httpx.Response(425), httpx.Response(429), created())

    with make_client(script, retry_statuses=RELEASED_4XX) as client:
        assert client.post("/x").status_code == 201

    assert len(script.requests) == 4 and len(set(script.keys)) == 1


def test_a_business_409_is_not_retried() -> None:
    script = Script(problem("name-taken", 409), created())

    with make_client(script) as client, pytest.raises(NonRetryableError):
        client.post("/x")

    assert len(script.requests) == 1


@pytest.mark.parametrize("status", [501, 505])
def test_permanent_5xx_are_not_retried(status: int) -> None:
    script = Script(httpx.Response(status), created())

    with make_client(script) as client, pytest.raises(NonRetryableError):
        client.post("/x")

    assert len(script.requests) == 1


def test_a_server_without_an_idempotency_store_is_not_retried() -> None:
    script = Script(problem("store-not-set-up", 500), created())

    with make_client(script) as client, pytest.raises(NonRetryableError) as caught:
        client.post("/x")

    assert len(script.requests) == 1
    assert caught.value.status == 500


def test_retry_statuses_opts_in_to_retrying_a_4xx() -> None:
    script = Script(httpx.Response(429, headers={"Retry-After": "3"}), created())
    events: list[AttemptEvent] = []

    with make_client(script, events, retry_statuses={429}) as client:
        assert client.post("/x").status_code == 201

    assert events[0].verdict == "retry" and events[0].wait == pytest.approx(3.05)


def test_attempts_run_out_on_5xx() -> None:
    script = Script(problem("store-unavailable", 503, retry_after=1))

    with make_client(script, attempts=4) as client, pytest.raises(RetriesExhausted) as caught:
        client.post("/x", operation="op")

    error = caught.value
    assert len(script.requests) == 4 and len(set(script.keys)) == 1
    assert error.attempts == 4 and error.status == 503
    assert error.key == script.keys[0] and error.key in str(error)
    assert error.problem is not None and error.problem["status"] == 503


def test_attempts_run_out_on_network_errors() -> None:
    failure = httpx.ConnectError("refused")
    script = Script(failure)

    with make_client(script, attempts=3) as client, pytest.raises(RetriesExhausted) as caught:
        client.post("/x")

    assert caught.value.response is None and caught.value.status is None
    assert caught.value.__cause__ is failure
    assert "ConnectError" in str(caught.value)


def test_total_timeout_stops_retrying() -> None:
    script = Script(httpx.Response(503))
    events: list[AttemptEvent] = []

    with stamina.set_testing(False):  # real waits: 0.05 s ceilings, 0.2 s budget
        backoff = Backoff(initial=0.05, maximum=0.05, random=lambda: 1.0)
        with (
            make_client(script, events, attempts=1000, total_timeout=0.2, backoff=backoff) as c,
            pytest.raises(RetriesExhausted),
        ):
            c.post("/x")

    assert 2 <= len(script.requests) < 50
    assert all(e.wait == pytest.approx(0.05) for e in events)


# -- keys --------------------------------------------------------------------------------


def test_an_operation_name_reuses_its_key_across_calls_and_clients() -> None:
    store = MemoryKeyStore()
    script = Script(created())

    with make_client(script, key_store=store) as first:
        first.post("/x", operation="order-42/worker")
        first.post("/x", operation="order-43/worker")
    with make_client(script, key_store=store) as second:
        second.post("/x", operation="order-42/worker")

    assert script.keys[0] == script.keys[2] != script.keys[1]


def test_without_an_operation_each_call_gets_a_new_key() -> None:
    script = Script(created())

    with make_client(script) as client:
        client.post("/x")
        client.post("/x")
        client.post("/x", key="explicit-key")

    assert script.keys[0] != script.keys[1]
    assert script.keys[2] == "explicit-key"


def test_operation_and_key_together_are_refused() -> None:
    with make_client(Script(created())) as client, pytest.raises(TypeError):
        client.post("/x", operation="a", key="b")


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempts"):
        IdempotentClient("http://api.test", attempts=0)


def test_a_restarted_client_reuses_the_persisted_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    script = Script(httpx.ReadTimeout("timed out"), created(replayed=True))

    # The first process tries once, times out, and dies.
    first = make_client(script, attempts=1, key_store=SQLiteKeyStore(path))
    with first, pytest.raises(RetriesExhausted):
        first.post("/v1/workers", json={"cpu": 2}, operation="order-42/worker")
    # A new process, a new client, the same file.
    with make_client(script, key_store=SQLiteKeyStore(path)) as second:
        response = second.post("/v1/workers", json={"cpu": 2}, operation="order-42/worker")

    assert is_replay(response)
    assert script.keys[0] == script.keys[1]


def test_sqlite_key_store_gives_one_key_to_concurrent_threads(tmp_path: Path) -> None:
    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    barrier = threading.Barrier(8)
    keys: list[str] = []

    def ask() -> None:
        barrier.wait(timeout=10)
        keys.append(store.key_for("same-operation"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(keys) == 8 and len(set(keys)) == 1
    assert len(store) == 1


def test_sqlite_key_store_forget_and_prune(tmp_path: Path) -> None:
    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    first = store.key_for("a")
    store.key_for("b")

    store.forget("a")

    assert store.key_for("a") != first
    assert store.prune(older_than=3600) == 0
    assert store.prune(older_than=-1) == 2
    assert len(store) == 0


def test_memory_key_store_forget() -> None:
    store = MemoryKeyStore(mint=iter(["k1", "k2"]).__next__)

    assert store.key_for("op") == "k1" == store.key_for("op")
    store.forget("op")
    assert store.key_for("op") == "k2"


# -- pieces ------------------------------------------------------------------------------


def test_backoff_is_full_jitter_capped_and_floored_by_retry_after() -> None:
    high = Backoff(initial=0.1, maximum=1.0, max_retry_after=10.0, random=lambda: 0.999999)
    low = Backoff(initial=0.1, maximum=1.0, random=lambda: 0.0)

    assert [round(high.ceiling(n), 3) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1, 1]
    assert high.ceiling(10_000) == 1.0
    assert low.wait(3) == 0.0
    assert high.wait(3) == pytest.approx(0.4, abs=1e-5)
    assert low.wait(1, retry_after=2.0) == 2.0
    assert high.wait(1, retry_after=600.0) == pytest.approx(10.1, abs=1e-5)


def test_backoff_default_random_stays_within_its_ceiling() -> None:
    backoff = Backoff(initial=0.1, maximum=0.8)
    waits = [backoff.wait(n) for n in range(1, 7) for _ in range(50)]

    assert all(0.0 <= w <= 0.8 for w in waits)
    assert len(set(waits)) > 100  # jittered, not a fixed schedule


def test_retry_after_parses_seconds_and_http_dates() -> None:
    def answer(value: str) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": value})

    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    assert retry_after_seconds(answer("7")) == 7.0
    assert retry_after_seconds(answer(email.utils.format_datetime(later, usegmt=True))) == (
        pytest.approx(30, abs=2)
    )
    assert retry_after_seconds(answer("Wed, 21 Oct 2015 07:28:00 GMT")) == 0.0
    assert retry_after_seconds(answer("soon")) is None
    assert retry_after_seconds(httpx.Response(503)) is None


def test_verdict_and_problem_of() -> None:
    assert verdict(httpx.Response(204)) == "success"
    assert verdict(httpx.Response(302)) == "success"
    assert verdict(problem("request-in-flight", 409)) == "retry"
    assert verdict(httpx.Response(409, json={"type": "x#request-in-flight"})) == "fail"
    assert problem_of(httpx.Response(400, json={"type": "t"})) is None
    bad = httpx.Response(400, headers={"Content-Type": "application/problem+json"}, content=b"{")
    assert problem_of(bad) is None
    assert problem_of(problem("key-reused", 422)) == {
        "type": PROBLEM_BASE + "key-reused",
        "title": "key-reused",
        "status": 422,
        "detail": "d",
    }


def test_async_client_retries_with_one_key() -> None:
    script = Script(httpx.ReadTimeout("slow"), problem("request-in-flight", 409, 1), created(True))
    events: list[AttemptEvent] = []

    async def run() -> httpx.Response:
        async with AsyncIdempotentClient(
            "http://api.test",
            transport=httpx.MockTransport(script),
            backoff=NO_JITTER,
            on_attempt=events.append,
        ) as client:
            return await client.post("/x", json={"a": 1}, operation="op")

    response = asyncio.run(run())

    assert is_replay(response)
    assert len(set(script.keys)) == 1 and len(script.requests) == 3
    assert [e.verdict for e in events] == ["retry", "retry", "success"]


def test_async_client_raises_non_retryable() -> None:
    script = Script(problem("key-reused", 422))

    async def run() -> None:
        client = AsyncIdempotentClient("http://api.test", transport=httpx.MockTransport(script))
        try:
            await client.post("/x")
        finally:
            await client.aclose()

    with pytest.raises(NonRetryableError):
        asyncio.run(run())


def test_the_package_imports_without_httpx_and_the_client_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['httpx'] = None; sys.modules['stamina'] = None\n"
        "import django_idempotency\n"
        "try:\n"
        "    import django_idempotency.client\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )

    assert done.returncode == 0, done.stderr
    assert "ImportError: django_idempotency.client needs httpx and stamina" in done.stdout
    assert "pip install 'django-idempotency[client]'" in done.stdout


# -- real HTTP against the example project ---------------------------------------------

ALICE = "alice-demo-token-" + "0" * 23
REBOOT_SECONDS = 1.5


class ExampleServer:
    """leasebroker (gunicorn, threaded) on a fresh SQLite file, as a subprocess."""

    def __init__(self, tmp: Path) -> None:
        self.database_url = sqlite_url(tmp)
        self.database = tmp / "leasebroker.sqlite3"
        self.url = ""
        self.log = tmp / "server.log"
        self.server: Gunicorn | None = None

    def start(self) -> None:
        for command in (
            ["manage.py", "migrate", "--noinput", "-v", "0"],
            ["manage.py", "create_demo_principals"],
        ):
            code, output = run_in_example(command, self.database_url)
            assert code == 0, output
        self.server = Gunicorn("leasebroker.wsgi", cwd=EXAMPLE, log=self.log)
        self.url = self.server.url
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            DATABASE_URL=self.database_url,
            DJANGO_SETTINGS_MODULE="leasebroker.settings",
            LEASEBROKER_REBOOT_SECONDS=str(REBOOT_SECONDS),
            DEBUG="false",
        )
        self.server.start(env)
        try:
            answer = httpx.get(f"{self.url}/v1/workers", headers=self.auth, timeout=30)
        except httpx.TransportError as exc:
            pytest.fail(f"the example server did not answer ({exc}):\n{self.log.read_text()}")
        assert answer.status_code == 200, self.log.read_text()

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Token {ALICE}"}

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def client(self, **kwargs: Any) -> IdempotentClient:
        kwargs.setdefault("backoff", Backoff(initial=0.05, maximum=0.5))
        kwargs.setdefault("timeout", 10.0)
        return IdempotentClient(self.url, headers=self.auth, **kwargs)

    def workers_labelled(self, label: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/v1/workers", headers=self.auth, timeout=10)
        return [w for w in answer.json() if (w.get("labels") or {}).get("test") == label]

    def worker(self, worker_id: str) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/v1/workers/{worker_id}", headers=self.auth, timeout=10)
        result: dict[str, Any] = answer.json()
        return result


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleServer]:
    example = ExampleServer(tmp_path_factory.mktemp("client-http"))
    try:
        example.start()
        yield example
    finally:
        example.stop()


@pytest.fixture
def real_waits() -> Iterator[None]:
    """Over real HTTP the client waits for real (Retry-After is 1 s)."""
    with stamina.set_testing(False):
        yield


def worker_body(label: str, cpu: int = 2) -> dict[str, Any]:
    return {"image": "ubuntu-24.04", "cpu": cpu, "memory_gb": 4, "labels": {"test": label}}


def test_http_a_repeated_operation_is_replayed_and_creates_one_worker(
    server: ExampleServer, real_waits: None
) -> None:
    events: list[AttemptEvent] = []
    with server.client(on_attempt=events.append) as client:
        first = client.post("/v1/workers", json=worker_body("replay"), operation="replay-op")
        again = client.post("/v1/workers", json=worker_body("replay"), operation="replay-op")

    assert first.status_code == 201 and not is_replay(first)
    assert again.status_code == 201 and is_replay(again)
    assert again.content == first.content
    assert again.headers["Location"] == first.headers["Location"]
    assert len(server.workers_labelled("replay")) == 1
    assert [e.replayed for e in events] == [False, True]


def test_http_422_raises_with_the_servers_problem(server: ExampleServer, real_waits: None) -> None:
    with server.client() as client:
        client.post("/v1/workers", json=worker_body("reuse"), operation="reuse-op")
        with pytest.raises(NonRetryableError) as caught:
            client.post("/v1/workers", json=worker_body("reuse", cpu=4), operation="reuse-op")

    error = caught.value
    assert error.status == 422 and error.attempts == 1
    assert error.problem is not None and error.problem["type"].endswith("key-reused")
    assert error.response is not None
    assert error.response.headers["Content-Type"].startswith("application/problem+json")
    assert len(server.workers_labelled("reuse")) == 1


def test_http_a_concurrent_duplicate_gets_409_then_the_replay(
    server: ExampleServer, real_waits: None
) -> None:
    """A duplicate sent while the original reboot runs (its claim committed) gets 409;
    the client waits Retry-After and gets the replay."""
    with server.client() as client:
        worker_id = client.post("/v1/workers", json=worker_body("race")).json()["id"]
    key = f"reboot-{worker_id}"
    events: list[AttemptEvent] = []
    lock = threading.Lock()
    responses: list[httpx.Response] = []

    def reboot() -> None:
        def record(event: AttemptEvent) -> None:
            with lock:
                events.append(event)

        with server.client(on_attempt=record) as client:
            answer = client.post(f"/v1/workers/{worker_id}/reboot", key=key)
        with lock:
            responses.append(answer)

    def claimed() -> bool:
        with closing(sqlite3.connect(f"file:{server.database}?mode=ro", uri=True)) as db:
            row = db.execute(
                "SELECT state FROM django_idempotency_record WHERE key = ?", [key]
            ).fetchone()
        return row == ("claimed",)

    threads = [threading.Thread(target=reboot) for _ in range(2)]
    threads[0].start()
    wait_for(claimed)  # the original runs its slow reboot, its claim committed
    threads[1].start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(r.status_code for r in responses) == [200, 200]
    assert sorted(is_replay(r) for r in responses) == [False, True]
    assert responses[0].content == responses[1].content
    conflicts = [e for e in events if e.status == 409]
    assert conflicts, [(e.number, e.status) for e in events]
    assert all(e.verdict == "retry" and e.wait is not None and e.wait >= 1 for e in conflicts)
    assert server.worker(worker_id)["reboots"] == 1


def test_http_a_restarted_client_resumes_with_its_persisted_key(
    server: ExampleServer, real_waits: None, tmp_path: Path
) -> None:
    with server.client() as client:
        worker_id = client.post("/v1/workers", json=worker_body("restart")).json()["id"]
    store = tmp_path / "keys.sqlite3"
    operation = f"reboot {worker_id} for ticket 7"

    # The first process gives up while the slow reboot runs on the server, and dies.
    first = server.client(attempts=1, timeout=REBOOT_SECONDS / 4, key_store=SQLiteKeyStore(store))
    with first, pytest.raises(RetriesExhausted) as caught:
        first.post(f"/v1/workers/{worker_id}/reboot", operation=operation)
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)
    # The restarted process finds the key in the store and gets the result.
    with server.client(key_store=SQLiteKeyStore(store)) as second:
        answer = second.post(f"/v1/workers/{worker_id}/reboot", operation=operation)

    assert caught.value.key == SQLiteKeyStore(store).key_for(operation)
    assert answer.status_code == 200
    assert answer.json()["reboots"] == 1  # the first attempt's reboot, replayed
    assert server.worker(worker_id)["reboots"] == 1


def test_http_async_client(server: ExampleServer, real_waits: None) -> None:
    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with AsyncIdempotentClient(server.url, headers=server.auth) as client:
            body = worker_body("async")
            first = await client.post("/v1/workers", json=body, operation="async-op")
            again = await client.post("/v1/workers", json=body, operation="async-op")
            return first, again

    first, again = asyncio.run(run())

    assert first.status_code == 201 and not is_replay(first)
    assert is_replay(again) and again.content == first.content
    assert len(server.workers_labelled("async")) == 1
