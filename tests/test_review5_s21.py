"""A review's tests against PostgreSQL: USE_TZ = False at fall-back, replay fidelity,
on_commit, nested savepoints and woken waiters (each cites the docs it holds to)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_idempotency import store
from django_idempotency.store import clock
from tests.support.clients import client_for
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FP = "a" * 64
DAY = 86400.0
LEASE = 30.0
#: Europe/Paris falls back on 2026-10-25 at 01:00 UTC: 02:00-03:00 local happens twice,
#: first as CEST (00:00-01:00 UTC), then as CET (01:00-02:00 UTC).
FALL_BACK = dt.datetime(2026, 10, 25, 1, 0, tzinfo=dt.UTC)


@contextmanager
def db_clock_at(moment: dt.datetime) -> Iterator[None]:
    """Put the store's (database's) clock at ``moment`` with the clock offset."""
    before = clock.offset()
    clock.set_offset(before + (moment - dt.datetime.now(dt.UTC)).total_seconds())
    try:
        yield
    finally:
        clock.set_offset(before)


def _scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def _response() -> store.StoredResponse:
    return store.StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')


def partitioned() -> bool:
    from django_idempotency.store.catalog import is_partitioned

    return is_partitioned(connection)


# --- 1. USE_TZ = False: a window ending in the first pass of the repeated hour ------------


def test_use_tz_false_completion_whose_window_ends_in_the_repeated_hour() -> None:
    """docs/storage.md ("Time zones and USE_TZ = False"): with USE_TZ = False "the store
    never relies on [naive local datetimes] (they are ambiguous in the hour repeated when
    clocks go back): it reads its own times in SQL as UTC ... and passes aware
    datetimes". Leases and retention "follow real elapsed time ... whatever USE_TZ and
    TIME_ZONE are".

    The partitioned claim returns the record's partition key ``sweep_after`` and the
    completion sends it back to prune to one partition. Read as Django reads a
    timestamptz under USE_TZ = False (naive local time), a 02:30 in the repeated hour
    went back as the second (CET) 02:30, an hour off, and a claim whose window (24 h)
    ends in the first pass of that hour (00:00-01:00 UTC) was fenced off by its own
    completion. The claim now returns it as UTC: the completion commits and replays.
    """
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        assert partitioned()
        sc = _scope()
        claim_at = FALL_BACK - dt.timedelta(days=1, minutes=30)  # window ends 00:30 UTC
        with db_clock_at(claim_at):
            won = store.claim(sc, FP, lease=LEASE, retention=DAY)
            assert isinstance(won, store.Claim)
            with transaction.atomic():
                store.complete(won, _response())
            replay = store.claim(sc, FP, lease=LEASE, retention=DAY)
            assert isinstance(replay, store.Existing) and replay.completed
    connections.close_all()


def test_use_tz_false_request_whose_window_ends_in_the_repeated_hour_end_to_end(
    alice: Any,
) -> None:
    """The same through a view (docs/storage.md, "Time zones and USE_TZ = False";
    docs/protocol.md: 409 lease-lost only when "a retry took the claim over").

    ``POST /outcome`` (default 24 h retention) with the database clock at 00:30 UTC the
    day before Europe/Paris falls back: the first request is answered by the view
    (200) and its Widget kept, and retries replay (they were 409 lease-lost, each
    fenced by its own partition key read back as naive local time).
    """
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        api = client_for(alice)
        key = str(uuid.uuid4())
        with db_clock_at(FALL_BACK - dt.timedelta(days=1, minutes=30)):
            first = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            second = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            third = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        statuses = [r.status_code for r in (first, second, third)]
        assert statuses[0] == 200, (statuses, first.content)
        assert Widget.objects.filter(name="outcome").count() == 1
        assert second.status_code == 200 and second.headers.get("Idempotent-Replayed") == "true"
        assert third.status_code == 200 and third.headers.get("Idempotent-Replayed") == "true"
    connections.close_all()


def test_use_tz_false_window_ending_in_the_second_pass_of_the_repeated_hour_completes(
    alice: Any,
) -> None:
    """The same request one hour later, its window ending in the second (CET) pass of
    the repeated hour, completes and replays (the pass PostgreSQL picks for an
    ambiguous naive local time, so this one held before the fix too)."""
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        api = client_for(alice)
        key = str(uuid.uuid4())
        with db_clock_at(FALL_BACK - dt.timedelta(days=1) + dt.timedelta(minutes=30)):
            first = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            second = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert first.status_code == 200, first.content
        assert second.status_code == 200 and second.headers.get("Idempotent-Replayed") == "true"
    connections.close_all()


# --- 2. Replay fidelity (docs/protocol.md, "Replay") -------------------------------------

URLS = pytest.mark.urls("tests.support.response_views")


def _twice(api: Any, url: str, data: Any = None) -> tuple[Any, Any]:
    key = str(uuid.uuid4())
    first = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    second = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    return first, second


@URLS
@pytest.mark.parametrize("url", ["/s21/binary", "/s21/latin1", "/s21/described"])
def test_replay_is_byte_exact_with_its_headers(api: Any, url: str) -> None:
    """docs/protocol.md "Replay": the exact status, body bytes and every header but the
    per-exchange ones (Content-Type, Content-Language, Cache-Control, Link, Vary...)."""
    first, second = _twice(api, url)
    assert first.status_code == second.status_code == 201
    assert second.content == first.content
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    for name in ("Content-Type", "Content-Language", "Cache-Control", "Link"):
        assert second.headers.get(name) == first.headers.get(name), name
    assert second.headers.get("Vary") == first.headers.get("Vary")
    assert int(second.headers["Content-Length"]) == len(first.content)
    assert Widget.objects.count() == 1


@URLS
def test_replay_of_204_has_no_body(api: Any) -> None:
    """docs/protocol.md "Replay": a 204 replays as a 204 without a body (CommonMiddleware
    adds its Content-Length: 0 to the first answer and the replay alike)."""
    first, second = _twice(api, "/s21/no-content")
    assert first.status_code == second.status_code == 204
    assert second.content == b""
    assert second.headers.get("Content-Length") == first.headers.get("Content-Length")
    assert Widget.objects.count() == 1


@URLS
def test_body_at_max_response_bytes_replays_and_one_more_byte_gives_410(api: Any) -> None:
    """docs/robustness.md "MAX_RESPONSE_BYTES": a body up to the limit is kept; a larger
    one is sent in full, its completion commits without the body and a retry gets 410
    with original_status and Location, the view not run again."""
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 1000}):
        first, second = _twice(api, "/s21/sized", {"n": 1000})
        assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
        assert second.status_code == 201 and second.content == b"x" * 1000
        assert second.headers["Idempotent-Replayed"] == "true"
        big, gone = _twice(api, "/s21/sized", {"n": 1001})
    assert big.status_code == 201 and len(big.content) == 1001
    assert gone.status_code == 410 and gone.json()["original_status"] == 201
    assert gone.headers["Location"] == "/things/1"
    assert gone.headers["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 2


# --- 3. The view's own transaction outcomes ---------------------------------------------


@URLS
def test_on_commit_runs_once_and_never_on_replay(api: Any) -> None:
    """docs/faq.md (view transaction outcomes) / Django: on_commit callbacks run when the
    view's transaction commits, once; a replay runs nothing."""
    first, second = _twice(api, "/s21/on-commit")
    assert first.status_code == 201 and second.status_code == 201
    assert Widget.objects.filter(name="on-commit").count() == 1
    assert Widget.objects.filter(name="body").count() == 1


@URLS
@pytest.mark.parametrize("code", [503, 409, 429])
def test_on_commit_never_runs_for_a_released_status(api: Any, code: int) -> None:
    """docs/protocol.md "Stored or released": a returned 5xx/409/429 rolls the view's
    writes back; its on_commit callbacks must not run, and a retry runs the view again."""
    first, second = _twice(api, "/s21/on-commit", {"status": code})
    assert first.status_code == code and second.status_code == code
    assert "Idempotent-Replayed" not in second.headers
    assert Widget.objects.count() == 0


@URLS
def test_a_caught_integrity_error_in_a_nested_block_keeps_the_outer_writes(api: Any) -> None:
    """docs/robustness.md: only the view's own outcome counts; a nested atomic() that
    rolled back to its savepoint leaves the outer writes, which commit with the record."""
    first, second = _twice(api, "/s21/caught-integrity")
    assert first.status_code == 201, first.content
    assert second.status_code == 201 and second.headers.get("Idempotent-Replayed") == "true"
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after-caught", "kept"]


# --- 4. Concurrency: waiters when the original releases ----------------------------------


def _waiting_advisory_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(cursor.fetchone()[0])


@URLS
def test_waiters_of_a_released_original_run_the_view_once_more_and_replay_it(alice: Any) -> None:
    """docs/protocol.md "Bounded wait": with wait=, "the original fails and releases the
    key: the duplicate claims it and runs the view"; exactly one of the woken duplicates
    runs it (claim = insert against the unique scope), the others get its replay."""
    import time

    from tests.support.concurrency import Runner, token_client
    from tests.support.response_views import FLAKY

    FLAKY.update(runs=0, lock=threading.Lock(), entered=threading.Event(), open=threading.Event())
    key = str(uuid.uuid4())

    def post() -> Any:
        return token_client(alice.key).post(
            "/s21/flaky-wait", {}, format="json", HTTP_IDEMPOTENCY_KEY=key
        )

    runner = Runner()
    try:
        runner.start(post)
        assert FLAKY["entered"].wait(30)
        for _ in range(4):
            runner.start(post)
        deadline = time.monotonic() + 30
        while _waiting_advisory_locks() < 4:  # every duplicate queued on the owner's lock
            assert time.monotonic() < deadline, "duplicates never queued"
            time.sleep(0.01)
    finally:
        FLAKY["open"].set()
    results = runner.join()
    statuses = sorted(r.status_code for r in results)
    assert statuses == [201, 201, 201, 201, 503], statuses
    replayed = [r for r in results if r.headers.get("Idempotent-Replayed") == "true"]
    assert len(replayed) == 3
    assert FLAKY["runs"] == 2
    assert list(Widget.objects.values_list("name", flat=True)) == ["flaky-2"]
