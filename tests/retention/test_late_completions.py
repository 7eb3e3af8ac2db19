"""The sweeper against late completions, on PostgreSQL with real threads and sessions:
a completion that commits during a sweep, behind a drop that timed out waiting for the
table's lock, or before the sweep, is never dropped with its day: the record stays and
the retry replays (docs/retention.md, "A late completion stays replayable",
"Dropping a day")."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_idempotency import retention, store, testing
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.retention import sweeper
from tests.support.factories import partition_day

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


DAY = 86400.0


FP = "c" * 64


def _scope(key: str | None = None) -> store.Scope:
    return store.Scope("auth.user:6", "POST /late-completion", key or str(uuid.uuid4()))


def _wait_until(predicate: Any, timeout: float = 20.0) -> bool:
    """Poll a database condition (not a sleep used as synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _backend_waits_on_lock(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def _late_claim(key: str) -> store.Claim:
    """A claim made two days ago whose window (60 s) and lease (30 s) are long over,
    nobody having taken it over: its owner may still complete, late. Its day has a
    partition (made ahead by the sweeper at the time)."""
    from django_idempotency.retention import partitions

    with testing.travel(-2 * DAY):
        partitions.ensure(connection, store.clock.store_now(connection).date())
        owner = store.claim(_scope(key), FP, lease=30, retention=60)
    assert isinstance(owner, store.Claim)
    return owner


@contextmanager
def _completing_late(owner: store.Claim) -> Iterator[None]:
    """The owner's late completion in a session of its own: written, not committed,
    while the block runs; committed when it ends."""
    updated, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def late_owner() -> None:
        try:
            with transaction.atomic():
                store.complete(owner, store.StoredResponse(201, [], b'{"id": 1}'))
                updated.set()
                assert commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
            updated.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=late_owner)
    thread.start()
    try:
        assert updated.wait(30) and not errors, errors
        yield
    finally:
        commit.set()
        thread.join(30)
    assert not errors, errors


class _Session(threading.Thread):
    """``work()`` in a thread with a database session of its own; its backend's pid, its
    result and what it raised."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.pid: int | None = None
        self.results: list[Any] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.results.append(self.work())
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()


def test_a_late_completion_committing_during_a_sweep_is_not_dropped_with_its_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim whose window ended on an earlier UTC day (its lease too: the owner ran
    long, nobody retried) completes *while* the sweeper works on that day: the owner's
    fenced completion (allowed: nobody took the key over) pushes ``expires_at`` to
    ``completed_at + lease`` and commits just after the sweeper's probe of the day.

    Expected: the completed record is kept at least one lease after its completion
    commits, and the sweeper never forgets a record inside its (extended) window.
    Promised in docs/retention.md ("A late completion stays replayable ... Rule:
    expires_at = max(expires_at, completed_at + lease)"; "The sweeper never forgets a
    record inside its window or holding a live lease, on any backend"; "A day partition
    that still holds a record inside its (extended) window or lease is kept (held)"),
    and retention.py ("unless a record in it is still inside its window (expires_at >
    now: a takeover, a heartbeat or a late completion pushed it)").

    How: the drop takes the record table's ACCESS EXCLUSIVE lock before its probe
    (``holds_live_records``), which waits for the owner's transaction.
    """
    if not sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    monkeypatch.setattr(sweeper, "LOCK_TIMEOUT", 30.0)
    key = str(uuid.uuid4())
    owner = _late_claim(key)
    with _completing_late(owner):
        sweep = _Session(retention.sweep)
        sweep.start()
        assert _wait_until(lambda: sweep.pid is not None), "the sweeper never connected"
        # The sweeper probed the day and now waits for the owner's transaction (or has
        # already finished: then it held the day, which is fine too).
        _wait_until(lambda: _backend_waits_on_lock(sweep.pid) or not sweep.is_alive())
    sweep.join(30)
    assert not sweep.errors, sweep.errors
    reports = sweep.results
    record = IdempotencyRecord.objects.filter(pk=owner.record_id).first()
    assert record is not None, (
        f"the late completion committed (201 sent) and the sweeper dropped it with its "
        f"day: report {reports[0].as_dict() if reports else None}"
    )
    assert record.state == RecordState.COMPLETED
    retry = store.claim(_scope(key), FP, lease=30, retention=60)
    assert isinstance(retry, store.Existing) and retry.completed


def test_a_late_completion_behind_a_timed_out_drop_is_not_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same late completion (window and lease over on an earlier UTC day, the owner
    completes, nobody took the key over), but its transaction stays open longer than
    the sweeper's lock wait (``sweeper.LOCK_TIMEOUT``, made short here): the day is
    reported in ``errors``; then the owner commits (the client gets its 201), and the
    next sweep runs.

    Expected (docs/retention.md): "A drop that times out ... is reported in errors and
    retried by the next run"; "A late completion stays replayable" (kept at least one
    lease after its completion commits); "The sweeper never forgets a record inside its
    window or holding a live lease"; "A day partition that still holds a record inside
    its (extended) window or lease is kept (held)". So the retry replays, and the next
    sweep holds the day.

    How: the drop's wait for the table's lock times out before its probe; the day is
    left as it was.
    """
    if not sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    monkeypatch.setattr(sweeper, "LOCK_TIMEOUT", 0.5)
    key = str(uuid.uuid4())
    owner = _late_claim(key)
    with _completing_late(owner):
        first = retention.sweep()  # waits for the owner's transaction, then gives up
    # The drop's lock wait ran out behind the owner: the day is an error, left as it was.
    assert first.errors and not first.dropped, first.as_dict()
    assert IdempotencyRecord.objects.filter(pk=owner.record_id, state="completed").exists()
    retry = store.claim(_scope(key), FP, lease=30, retention=60)
    second = retention.sweep()
    kept = IdempotencyRecord.objects.filter(pk=owner.record_id).exists()
    assert isinstance(retry, store.Existing) and retry.completed, (
        f"the committed late completion is not replayed (sweep: {first.as_dict()}); the "
        f"retry got {retry!r}; the next sweep {'kept' if kept else 'dropped'} the record: "
        f"{second.as_dict()}"
    )
    assert kept, second.as_dict()


def test_a_late_completion_committed_before_the_sweep_holds_its_day() -> None:
    """The late completion of the first test, committed before the sweep starts:
    the probe sees ``expires_at = completed_at + lease`` and keeps the day (``held``),
    and the retry replays (docs/retention.md, "A late completion stays replayable")."""
    if not sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    key = str(uuid.uuid4())
    owner = _late_claim(key)
    with transaction.atomic():
        store.complete(owner, store.StoredResponse(201, [], b'{"id": 1}'))
    report = retention.sweep()
    assert report.held and not report.errors, report.as_dict()
    retry = store.claim(_scope(key), FP, lease=30, retention=60)
    assert isinstance(retry, store.Existing) and retry.completed


@pytest.fixture
def late_day() -> tuple[str, store.Claim, str, Any]:
    """A late claim's key and claim, and the name and partition of its record's day."""
    if not sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    from django_idempotency.retention import partitions

    key = str(uuid.uuid4())
    owner = _late_claim(key)
    name = partitions.partition_name(partition_day(owner))
    (partition,) = [p for p in partitions.list_partitions(connection) if p.name == name]
    return key, owner, name, partition


def test_a_drop_waits_for_a_late_completion_in_flight_and_keeps_its_day(
    late_day: tuple[str, store.Claim, str, Any],
) -> None:
    """``partitions.drop()`` while a late completion of the day is written, not yet
    committed: the drop waits for the record table's lock, then probes the day, finds
    the live record and keeps the day: ``drop`` returns ``False`` and the retry replays
    (docs/retention.md, "Dropping a day")."""
    from django_idempotency.retention import partitions

    key, owner, name, partition = late_day
    with _completing_late(owner):
        dropper = _Session(lambda: partitions.drop(connection, partition, lock_timeout=30))
        dropper.start()
        assert _wait_until(lambda: dropper.pid is not None), "the dropper never connected"
        assert _wait_until(lambda: _backend_waits_on_lock(dropper.pid)), "no drop waited"
    dropper.join(30)
    assert not dropper.errors, dropper.errors
    assert dropper.results == [False]
    (again,) = [p for p in partitions.list_partitions(connection) if p.name == name]
    assert again.attached
    retry = store.claim(_scope(key), FP, lease=30, retention=60)
    assert isinstance(retry, store.Existing) and retry.completed


def test_a_drop_that_times_out_behind_a_late_completion_leaves_the_day_attached(
    late_day: tuple[str, store.Claim, str, Any],
) -> None:
    """A late completion whose transaction stays open longer than ``partitions.drop()``
    waits for the record table's lock: the drop fails (``OperationalError``) and
    changes nothing; the owner then commits (the client gets its 201), and the next
    sweep holds the day, so the retry replays the 201 instead of running the view
    again (docs/retention.md, "Dropping a day")."""
    from django_idempotency.retention import partitions

    key, owner, name, partition = late_day
    with _completing_late(owner):
        dropper = _Session(lambda: partitions.drop(connection, partition, lock_timeout=0.5))
        dropper.start()
        dropper.join(30)
    assert not dropper.is_alive() and not dropper.results, dropper.results
    assert [type(e).__name__ for e in dropper.errors] == ["OperationalError"], dropper.errors
    (again,) = [p for p in partitions.list_partitions(connection) if p.name == name]
    assert again.attached
    report = retention.sweep()
    assert name in report.held and not report.errors, report.as_dict()
    retry = store.claim(_scope(key), FP, lease=30, retention=60)
    assert isinstance(retry, store.Existing) and retry.completed, (
        f"the committed late completion is not replayed after the sweep "
        f"{report.as_dict()}: the retry got {retry!r}"
    )
