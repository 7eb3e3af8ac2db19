"""The retry storm (example_project/storm.py) and its fault-injecting proxy.

* The proxy's faults, in-process against a tiny stdlib HTTP server: each fault does
  what the storm relies on (the upstream saw the request when the client saw none).
* The storm itself, as a user runs it, on PostgreSQL: gunicorn with several
  processes, many client threads through the proxy, idempotency on then off, and a
  gunicorn worker killed with SIGKILL in the middle of a create. Bounded: a reduced
  storm, and a hard timeout on the subprocess.
"""

from __future__ import annotations

import http.server
import random
import re
import sys
import threading
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import stamina  # noqa: F401
from django.conf import settings

from tests.support.example_project import EXAMPLE, run_in_example

if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from storm.proxy import NO_FAULTS, FaultProxy, FaultRates

STORM_TIMEOUT = 240  # seconds; the reduced storm takes about 25


class Upstream(http.server.ThreadingHTTPServer):
    """Answers every POST with 201 and counts the requests it got."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.seen.append(body)
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(upstream.server_address[1], rates=NO_FAULTS, stall=0.5, seed=1)
    fault_proxy.start()
    yield fault_proxy
    fault_proxy.stop()


def send(proxy: FaultProxy, fault: str, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(
        proxy.url + "/v1/workers",
        content=b'{"n": 1}',
        headers={"X-Storm-Fault": fault},
        timeout=timeout,
    )


def test_proxy_passes_requests_through(proxy: FaultProxy, upstream: Upstream) -> None:
    response = send(proxy, "pass")

    assert response.status_code == 201 and response.content == b"{}"
    assert upstream.seen == [b'{"n": 1}']


def test_proxy_drop_runs_the_request_and_sends_no_answer(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        send(proxy, "drop")

    assert upstream.seen == [b'{"n": 1}']
    assert proxy.counts["drop"] == 1


def test_proxy_duplicate_sends_two_copies_at_once(proxy: FaultProxy, upstream: Upstream) -> None:
    response = send(proxy, "duplicate")

    assert proxy.drain(timeout=10)
    assert response.status_code == 201
    assert upstream.seen == [b'{"n": 1}', b'{"n": 1}']


@pytest.mark.parametrize("fault", ["stall-request", "stall-response"])
def test_proxy_stalls_past_the_client_timeout_and_still_forwards(
    proxy: FaultProxy, upstream: Upstream, fault: str
) -> None:
    with pytest.raises(httpx.ReadTimeout):
        send(proxy, fault, timeout=0.1)

    assert proxy.drain(timeout=10)
    assert upstream.seen == [b'{"n": 1}']


def test_fault_rates_draw_each_fault() -> None:
    rng = random.Random(3)
    draws = [FaultRates().draw(rng) for _ in range(2000)]

    assert set(draws) == {"pass", "drop", "stall-request", "stall-response", "duplicate"}
    assert 0.5 < draws.count("pass") / len(draws) < 0.7
    assert {NO_FAULTS.draw(rng) for _ in range(100)} == {"pass"}


def admin_url() -> str:
    db = settings.DATABASES["default"]
    user = quote(db.get("USER") or "postgres", safe="")
    if db.get("PASSWORD"):
        user += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/postgres"


@pytest.mark.postgres
def test_the_storm_holds_with_idempotency_and_recovers_from_a_killed_worker() -> None:
    import gunicorn  # noqa: F401  # declared by the test extra: missing is a failure, not a skip
    import psycopg

    code, output = run_in_example(
        ["storm.py", "--database-url", admin_url(), "--operations", "40", "--clients", "8"],
        admin_url(),
        timeout=STORM_TIMEOUT,
    )

    assert code == 0, output
    assert "STORM PASSED: idempotency held" in output, output
    phantom = re.search(r"PHANTOM WORKERS \(beyond one per operation\)\s+(\d+)\s+(\d+)", output)
    assert phantom, output
    on, off = int(phantom.group(1)), int(phantom.group(2))
    assert on == 0, output
    assert off > 0, output  # restarted clients alone make phantom workers without keys
    created = re.search(r"workers created\s+(\d+)\s+(\d+)", output)
    assert created and int(created.group(1)) == 40, output
    # With keys, retries are answered by replays (without, only a rare duplicate is).
    assert re.search(r"replays \(Idempotent-Replayed: true\)\s+[1-9]\d*\s", output), output
    for fault in ("answers dropped after commit", "requests sent twice at once"):
        assert re.search(rf"proxy: {fault}\s+[1-9]", output), output
    # The crash: the worker running the create was killed; the retry took over.
    assert re.search(r"killed worker \d+ with SIGKILL while it was inside the view", output)
    assert re.search(r"attempt +1: no answer: \w+", output), output
    # The dead worker's session is gone, so its presence lock is: the retry takes over
    # at once, without a 409 for the rest of the lease (docs/robustness.md).
    assert re.search(r"attempt +\d+: 201", output), output
    assert not re.search(r"attempt +\d+: 409, retry in", output), output
    assert "workers created for this one operation: 1" in output, output
    assert "the record's state: completed" in output, output
    # The throwaway database is gone.
    name = re.search(r"database: \S+/(leasebroker_storm_[0-9a-f]+)", output)
    assert name, output
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name.group(1),))
        assert left.fetchone() is None


def test_the_storm_refuses_a_non_loopback_database() -> None:
    code, output = run_in_example(
        ["storm.py", "--database-url", "postgres://postgres@192.0.2.1:5432/postgres"],
        "sqlite:///unused.sqlite3",
        timeout=60,
    )

    assert code == 2, output
    assert "loopback only" in output, output


# --- the verdict: a broken promise, or clients that gave up --------------------------

from storm.clients import Tally  # noqa: E402
from storm.server import SetupError, wait_ready  # noqa: E402
from storm.verdict import RunResult, judge  # noqa: E402


def _run(answers: dict[int, set[str]], stored: dict[int, set[str]], gave_up: dict[int, int]):
    tally = Tally()
    for number, ids in answers.items():
        for worker_id in ids:
            tally.answered(number, worker_id)
    for number, clients in gave_up.items():
        for _ in range(clients):
            tally.fail(number, f"operation {number}: gave up after 10 attempts")
    return RunResult(
        mode="on",
        operations=len(answers.keys() | gave_up.keys()),
        jobs=0,
        tally=tally,
        faults={},
        stored={str(n): ids for n, ids in stored.items()},
        seconds=1.0,
    )


def test_clients_that_gave_up_are_reported_not_called_a_broken_promise() -> None:
    """Two clients gave up (retries exhausted on a loaded machine), nothing ran twice and
    every answer was the stored worker: the verdict is "held", and it says how many
    clients gave up and that their operations were resumed."""
    result = _run(
        answers={0: {"wkr-A"}, 1: {"wkr-B"}},
        stored={0: {"wkr-A"}, 1: {"wkr-B"}, 2: {"wkr-C"}},
        gave_up={2: 1, 3: 1},
    )
    result.tally.resumed[2] = "wkr-C"
    verdict = judge(result)
    line = verdict.line(result)
    assert verdict.held, line
    assert "-> held" in line and "BROKEN" not in line, line
    assert "2 clients gave up" in line and "not a broken promise" in line, line
    assert "1 operations not finished even when resumed" in line, line  # operation 3


@pytest.mark.parametrize(
    ("answers", "stored", "says"),
    [
        ({0: {"wkr-A"}}, {0: {"wkr-A", "wkr-B"}}, "1 phantom workers"),
        ({0: {"wkr-A", "wkr-B"}}, {0: {"wkr-A"}}, "told of two different workers"),
        ({0: {"wkr-Z"}}, {0: {"wkr-A"}}, "not the stored one"),
        ({0: {"wkr-A"}}, {}, "not the stored one"),  # answered, but no worker exists
    ],
)
def test_a_duplicate_or_a_wrong_answer_is_a_broken_promise(answers, stored, says) -> None:
    """An operation that ran twice, two clients told of different workers, or an answer
    that is not the stored worker: "BROKEN", naming what broke."""
    result = _run(answers=answers, stored=stored, gave_up={})
    verdict = judge(result)
    assert not verdict.held
    assert "-> BROKEN" in verdict.line(result) and says in verdict.line(result)


def test_readiness_is_polled_until_the_server_answers() -> None:
    """The server is waited for until it answers, however long below the deadline (a
    loaded machine), not for a fixed time; each probe's reason is kept for the error."""
    reasons = iter(["ConnectError", "HTTP 502", "1 of 2 workers up", None])
    seen: list[str | None] = []

    def probe() -> str | None:
        seen.append(next(reasons))
        return seen[-1]

    wait_ready(probe, timeout=60, what="gunicorn")
    assert seen == ["ConnectError", "HTTP 502", "1 of 2 workers up", None]


def test_readiness_gives_up_at_the_deadline_with_the_last_reason() -> None:
    """A server that never answers fails setup after the deadline, saying why."""
    with pytest.raises(SetupError, match=r"gunicorn was not ready after 0 s \(last: HTTP 503\)"):
        wait_ready(lambda: "HTTP 503", timeout=0, what="gunicorn")
