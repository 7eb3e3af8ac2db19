"""``manage.py idempotency_sweep`` and the Celery task (docs/retention.md), on both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.db.backends.signals import connection_created

from django_idempotency import retention, store, testing
from django_idempotency.models import IdempotencyRecord
from django_idempotency.retention import sweeper as retention_sweeper
from django_idempotency.store.schema.functions import SWEEP_LOCK
from tests.support.factories import create_window_day, partition_day
from tests.support.faults import admin_connection, wait_for
from tests.support.outages import outage_lines, proxy
from tests.support.pgbouncer import NOT_POOLED
from tests.support.relay_process import child

__all__ = ["child", "proxy"]  # the fixtures, used here

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400.0


def old_claim() -> store.Claim:
    sc = store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))
    with testing.travel(-9 * DAY):
        create_window_day(DAY)
        won = store.claim(sc, "a" * 64, lease=30, retention=DAY)
    assert isinstance(won, store.Claim)
    return won


def run(*args: str) -> str:
    out = StringIO()
    call_command("idempotency_sweep", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_dry_run_reports_and_keeps_everything():
    won = old_claim()
    output = run("--dry-run")
    assert output.startswith("Dry run: database 'default'")
    if connection.vendor == "postgresql":
        assert "Would drop partition django_idempotency_record_p" in output
    else:
        assert "Would delete 1 record." in output
    assert "Would delete 0 sent outbox messages." in output
    assert IdempotencyRecord.objects.filter(pk=won.record_id).exists()


def test_run_forgets_old_days_and_says_so():
    won = old_claim()
    output = run()
    if connection.vendor == "postgresql":
        assert "Dropped partition django_idempotency_record_p" in output
    else:
        assert "Deleted 1 record." in output
    assert not IdempotencyRecord.objects.filter(pk=won.record_id).exists()
    again = run("--database", "default")
    assert "Dropped" not in again and "Deleted 0 sent outbox messages." in again


@pytest.mark.postgres
def test_a_second_run_while_one_holds_the_lock_does_nothing():
    won = old_claim()
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", list(SWEEP_LOCK))
        assert "Another sweeper is running" in run()
        assert IdempotencyRecord.objects.filter(pk=won.record_id).exists()
    finally:
        with other.cursor() as cursor:  # closing alone releases it only eventually
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", list(SWEEP_LOCK))
        other.close()


@pytest.mark.postgres
def test_a_partition_that_could_not_be_dropped_fails_the_command(monkeypatch):
    won = old_claim()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM django_idempotency_record WHERE id = %s",
            [won.record_id],
        )
        (name,) = cursor.fetchone()
    monkeypatch.setattr(retention_sweeper, "LOCK_TIMEOUT", 0.2)
    reader = connection.copy()
    try:
        reader.set_autocommit(False)
        with reader.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")
        with pytest.raises(CommandError, match="could not be created or dropped"):
            run()
    finally:
        reader.rollback()
        reader.close()
    assert "Dropped partition" in run()


def test_celery_task_runs_the_sweep():
    from django_idempotency.tasks import sweep

    won = old_claim()
    assert sweep.name == "django_idempotency.sweep"
    report = sweep.apply(kwargs={"dry_run": True}).get()
    assert report["dry_run"] and IdempotencyRecord.objects.filter(pk=won.record_id).exists()
    report = sweep.apply().get()
    assert report["database"] == "default" and not report["skipped"]
    assert not IdempotencyRecord.objects.filter(pk=won.record_id).exists()


def test_the_sweeper_works_without_celery():
    """retention and the command import nothing from Celery."""
    script = (
        "import sys; sys.modules['celery'] = None\n"
        "import django; django.setup()\n"
        "import django_idempotency.retention\n"
        "import django_idempotency.management.commands.idempotency_sweep\n"
        "assert 'celery' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("command", ["idempotency_sweep", "idempotency_relay"])
def test_an_unknown_database_alias_is_a_usage_error(command):
    """A mistyped ``--database`` is refused by the argument parser with the aliases to
    choose from, as Django's own commands do, instead of a traceback."""
    with pytest.raises(CommandError, match=r"invalid choice: 'nope' \(choose from .*default"):
        call_command(command, "--database", "nope", stdout=StringIO(), stderr=StringIO())
    assert IdempotencyRecord.objects.count() == 0  # nothing ran


@pytest.mark.postgres
@pytest.mark.parametrize("via", ["sweep", "command"])
def test_a_past_day_kept_for_a_late_completion_is_reported_as_held(via):
    """A past day holding a record completed late (its owner ran long, nobody retried),
    the completion's window not over: the sweep keeps the day. The operator is told
    so: the report lists it in ``held``, not in ``dropped``, and the command prints
    "Kept partition ...", never "Dropped partition ..." for it; the retry replays
    (docs/retention.md)."""
    from django.db import transaction

    from django_idempotency.retention import partitions

    if not retention_sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    scope = store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))
    with testing.travel(-2 * DAY):
        create_window_day(60)
        owner = store.claim(scope, "a" * 64, lease=30, retention=60)
    assert isinstance(owner, store.Claim)
    name = partitions.partition_name(partition_day(owner))
    with transaction.atomic():
        store.complete(owner, store.StoredResponse(201, [], b'{"id": 1}'))
    if via == "sweep":
        report = retention.sweep()
        held, dropped = report.held, [p.name for p in report.dropped]
        output = ""
    else:
        output = run()
        held = [name] if f"Kept partition {name}: a record in it is still live." in output else []
        dropped = [name] if f"Dropped partition {name}" in output else []
    assert held == [name] and name not in dropped, (held, dropped, output)
    (partition,) = [p for p in partitions.list_partitions(connection) if p.name == name]
    assert partition.attached
    retry = store.claim(scope, "a" * 64, lease=30, retention=60)
    assert isinstance(retry, store.Existing) and retry.completed


def sweeps(lines: list[str]) -> int:
    """Sweeps the command reported: each ends with its sent-outbox line."""
    return sum(line.endswith("sent outbox messages.") for line in lines)


@pytest.mark.postgres
def test_the_sweeper_loop_rides_out_a_database_outage(child, proxy):
    """``idempotency_sweep --loop`` sweeps every ``--interval``; when the database goes
    away it logs one error, retries with backoff, logs one line when it is back and
    sweeps on; SIGTERM stops it with status 0."""
    sweeper = child(
        [],
        "--loop",
        "--interval",
        "0.05",
        env={
            "COMMAND_NAME": "idempotency_sweep",
            "RELAY_DB_PORT": str(proxy.port),
            "RELAY_LOG": "DEBUG",
        },
    )
    wait_for(lambda: sweeps(sweeper.lines) >= 2)  # it loops
    proxy.cut()
    sweeper.wait_for_log("still unavailable (try 2)")
    before = sweeps(sweeper.lines)
    proxy.restore()
    sweeper.wait_for_log("available again")
    wait_for(lambda: sweeps(sweeper.lines) > before)
    sweeper.signal(signal.SIGTERM)
    assert sweeper.exit_status() == 0, sweeper.stderr()
    started, ended = outage_lines(sweeper.log)
    assert len(started) == 1 and "idempotency sweep: database 'default' unavailable" in started[0]
    assert started[0].startswith("ERROR ") and len(ended) == 1
    assert "Traceback" not in sweeper.stderr()


def test_the_sweeper_loop_stops_on_sigterm_between_sweeps(child):
    """Waiting for its next sweep (an hour away), the loop exits 0 at once on SIGTERM."""
    sweeper = child([], "--loop", env={"COMMAND_NAME": "idempotency_sweep"})
    wait_for(lambda: sweeps(sweeper.lines) == 1)
    sweeper.signal(signal.SIGTERM)
    assert sweeper.exit_status() == 0, sweeper.stderr()
    assert sweeps(sweeper.lines) == 1


@pytest.mark.postgres
def test_one_sweep_reports_an_unreachable_database_in_one_line(child, proxy):
    """Without ``--loop`` (cron), an unreachable database is one line and status 1."""
    proxy.cut()
    sweeper = child([], env={"COMMAND_NAME": "idempotency_sweep", "RELAY_DB_PORT": str(proxy.port)})
    assert sweeper.exit_status() == 1
    assert "CommandError: database 'default' unavailable:" in sweeper.stderr()
    assert "Traceback" not in sweeper.stderr()


@pytest.mark.postgres
@NOT_POOLED
def test_the_sweep_command_closes_the_connections_it_opened_and_keeps_the_callers():
    """A process that calls the command and lives on (a Celery worker, a script) keeps no
    server session of it: the calling thread's connection it opened and its lock's
    holder are closed when it returns. A connection open before, the caller's, stays
    open in the same session."""
    old_claim()
    seen: list[tuple[Any, int]] = []

    def record(sender: object, connection: Any, **kwargs: object) -> None:
        seen.append((connection, connection.connection.info.backend_pid))

    connection_created.connect(record)
    try:
        connections["default"].close()  # the command opens the calling thread's own
        run()
        opened = [pid for _wrapper, pid in seen]
        assert len(opened) >= 2  # the calling thread's, the lock holder's
        wait_for(lambda: not _live(opened), timeout=10)
        assert all(wrapper.connection is None for wrapper, _pid in seen)

        connections["default"].ensure_connection()
        caller = connections["default"].connection.info.backend_pid
        run()
        assert connections["default"].connection.info.backend_pid == caller
        assert _live([caller]) == [caller]
    finally:
        connection_created.disconnect(record)


def _live(pids: list[int]) -> list[int]:
    """The pids among ``pids`` whose session the server still has."""
    with admin_connection() as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
        ).fetchall()
    return sorted(row[0] for row in rows)


@pytest.mark.postgres
def test_the_command_says_how_many_records_it_moved_out_of_the_default_partition():
    """A day ahead the sweeper had not created: its claims wait in the default partition,
    and the run that creates the day says it moved them there."""
    from django_idempotency.retention import partitions

    if not retention_sweeper.is_partitioned(connection):
        pytest.skip("partitioned table only")
    run()  # every day ahead exists
    sc = store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))
    won = store.claim(sc, "a" * 64, lease=30, retention=DAY)
    assert isinstance(won, store.Claim)
    (day,) = [p for p in partitions.list_partitions(connection) if p.day == partition_day(won)]
    with connection.cursor() as cursor:  # the day as if never created: its record waits
        cursor.execute(f"ALTER TABLE django_idempotency_record DETACH PARTITION {day.name}")
        cursor.execute(f"INSERT INTO django_idempotency_record SELECT * FROM {day.name}")
        cursor.execute(f"DROP TABLE {day.name}")
    output = run()
    assert f"Created partition for {day.day:%Y-%m-%d}." in output
    assert "Moved 1 record from the default partition into their days." in output
    assert IdempotencyRecord.objects.filter(pk=won.record_id).exists()
