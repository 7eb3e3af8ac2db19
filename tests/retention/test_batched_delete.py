"""The sweeper's batched delete: the plain record table (``PARTITION_RECORDS = False``
on PostgreSQL, and SQLite), docs/retention.md.

On a plain table the sweeper deletes the records whose window and lease are both over,
``SWEEP_BATCH_SIZE`` rows per statement, each batch its own transaction. On PostgreSQL
these tests run against real concurrent sessions: writers that make a record live
again while the delete runs, and claims made meanwhile.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings

from django_idempotency import retention, store, testing
from django_idempotency.models import IdempotencyRecord
from tests.support.faults import wait_for

DAY = 86400.0
FP, OTHER_FP = "d" * 64, "e" * 64


@pytest.fixture
def plain(record_table: str) -> str:
    """The plain record table (PostgreSQL with ``PARTITION_RECORDS = False``, or SQLite)."""
    if record_table == "partitioned":
        pytest.skip("the partitioned table drops whole days: tests/retention/test_partitions.py")
    return record_table


def _scope(key: str | None = None) -> store.Scope:
    return store.Scope("auth.user:8", "POST /batched", key or str(uuid.uuid4()))


def _claim(key: str | None = None, *, retention_s: float = DAY, lease: float = 30) -> Any:
    return store.claim(_scope(key), FP, lease=lease, retention=retention_s)


def _complete(owner: store.Claim) -> None:
    with transaction.atomic():
        store.complete(owner, store.StoredResponse(201, [], b'{"id": 1}'))


def _replays(key: str) -> bool:
    found = _claim(key)
    return isinstance(found, store.Existing) and found.completed


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _waits_on_a_lock(pid: int) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


class _Session(threading.Thread):
    """``work()`` in a thread with a database session of its own."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.results: list[Any] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            self.results.append(self.work())
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()


@contextmanager
def _writing(write: Callable[[], None]) -> Iterator[Callable[[], None]]:
    """``write()`` in a session of its own, in a transaction left open (its rows locked)
    until the returned ``commit()`` is called or the block ends."""
    written, commit = threading.Event(), threading.Event()

    def writer() -> None:
        with transaction.atomic():
            write()
            written.set()
            assert commit.wait(60)

    session = _Session(writer)
    session.start()
    try:
        assert written.wait(30) or session.errors, "the writer never wrote"
        assert not session.errors, session.errors
        yield commit.set
    finally:
        commit.set()
        session.join(60)
    assert not session.errors, session.errors


def _old(count: int) -> list[store.Claim]:
    """``count`` completed records whose windows ended days ago, oldest first."""
    owners = []
    for n in range(count):
        with testing.travel(-9 * DAY + n * 60):
            owner = _claim()
            assert isinstance(owner, store.Claim)
            _complete(owner)
        owners.append(owner)
    return owners


def _exists(owner: store.Claim) -> bool:
    return IdempotencyRecord.objects.filter(pk=owner.record_id).exists()


@pytest.mark.parametrize("batch", [1, 3, 7, 5000])
def test_the_delete_forgets_every_record_past_its_window_whatever_the_batch_size(plain, batch):
    """Seven records past their window and lease are deleted whatever
    ``SWEEP_BATCH_SIZE`` (one row a batch, batches that do not divide the count, one
    full batch, the default); the records still inside their window stay and replay,
    and the report counts exactly the records forgotten."""
    old = _old(7)
    kept_key = str(uuid.uuid4())
    kept = _claim(kept_key)
    _complete(kept)
    with override_settings(IDEMPOTENCY={"SWEEP_BATCH_SIZE": batch}):
        report = retention.sweep()
    assert report.method == "delete" and not report.errors
    assert report.deleted_records == 7, report.as_dict()
    assert not any(_exists(owner) for owner in old)
    assert _replays(kept_key)
    again = retention.sweep()
    assert again.deleted_records == 0


def test_the_delete_follows_each_records_window_and_lease(plain):
    """The rules of the batched delete: a record is forgotten once its own window and its
    lease are both over (completed, or in flight with its owner gone); one inside its
    window (a long retention, or pushed by a heartbeat of a long handler) is kept, and
    its key still answers (a replay, or 409 while in flight)."""
    with testing.travel(-3 * DAY):
        done_past = _claim()
        _complete(done_past)
        gone_owner = _claim()  # its owner died: window and lease long over
        long_window = _claim(retention_s=7 * DAY)
        _complete(long_window)
        running = _claim(lease=30)
    assert store.extend(running, 600) is True  # a heartbeat now: window and lease pushed
    report = retention.sweep()
    assert report.deleted_records == 2, report.as_dict()
    assert not _exists(done_past) and not _exists(gone_owner)
    assert _replays(long_window.scope.key)
    duplicate = _claim(running.scope.key)
    assert isinstance(duplicate, store.Existing) and duplicate.lease_remaining > 0
    fresh = _claim(gone_owner.scope.key)
    assert isinstance(fresh, store.Claim) and not fresh.taken_over  # the key is new


def test_a_dry_run_counts_and_deletes_nothing(plain):
    """``dry_run`` reports how many records would go and leaves them all."""
    old = _old(3)
    report = retention.sweep(dry_run=True)
    assert report.dry_run and report.deleted_records == 3
    assert all(_exists(owner) for owner in old)


def test_the_command_reports_the_records_it_deleted(plain):
    """``manage.py idempotency_sweep`` on a plain table says it deletes, and how many."""
    from io import StringIO

    _old(3)
    out = StringIO()
    call_command("idempotency_sweep", stdout=out, stderr=StringIO())
    assert "database 'default' (delete)" in out.getvalue()
    assert "Deleted 3 records." in out.getvalue()


@pytest.mark.postgres
def test_each_batch_commits_on_its_own_and_claims_go_on_during_the_delete(plain):
    """With ``SWEEP_BATCH_SIZE = 2`` and the newest old record locked by another
    session, the delete waits on its batch. Meanwhile the batches before it are
    committed (another session no longer sees their records), a claim for a new key is
    made at once, and a key already forgotten claims anew. Once the lock goes, the
    sweep forgets the rest."""
    old = _old(7)
    locked = old[-1]

    def lock() -> None:
        IdempotencyRecord.objects.select_for_update().get(pk=locked.record_id)

    pids: list[int] = []

    def sweep() -> retention.SweepReport:
        pids.append(_backend_pid())
        with override_settings(IDEMPOTENCY={"SWEEP_BATCH_SIZE": 2}):
            return retention.sweep()

    with _writing(lock):
        sweeper = _Session(sweep)
        sweeper.start()
        wait_for(lambda: pids and _waits_on_a_lock(pids[0]))
        left = [owner for owner in old if _exists(owner)]
        assert locked in left and len(left) < len(old), len(left)
        new = _claim()
        assert isinstance(new, store.Claim)
        forgotten = next(owner for owner in old if owner not in left)
        again = _claim(forgotten.scope.key)
        assert isinstance(again, store.Claim) and not again.taken_over
    sweeper.join(60)
    assert not sweeper.errors, sweeper.errors
    (report,) = sweeper.results
    assert report.deleted_records == 7, report.as_dict()
    assert not any(_exists(owner) for owner in old if owner is not forgotten)


@pytest.mark.postgres
def test_a_late_completion_committed_while_the_delete_waits_for_it_is_kept(plain):
    """A claim past its window and lease (its owner ran long, nobody retried) completes
    while the sweeper's delete of that row waits for the completion's lock: the
    completion pushes the record's window (``completed_at + lease``) and commits. The
    delete, tested again on the row as the owner left it, keeps the record: the retry
    replays and the view never runs twice (docs/retention.md, "A late completion stays
    replayable")."""
    key = str(uuid.uuid4())
    with testing.travel(-2 * DAY):
        owner = _claim(key, retention_s=60)
    assert isinstance(owner, store.Claim)
    sweeper = _backend_pid()
    with _writing(lambda: store.complete(owner, store.StoredResponse(201, [], b"{}"))) as commit:
        watcher = _Session(lambda: wait_for(lambda: _waits_on_a_lock(sweeper)) and commit())
        watcher.start()
        report = retention.sweep()
        watcher.join(60)
    assert not watcher.errors, watcher.errors
    assert report.method == "delete" and report.deleted_records == 0, report.as_dict()
    assert _replays(key), IdempotencyRecord.objects.filter(key=key).values()
