"""Behind PgBouncer in transaction-pooling mode: no session state (docs/deployment.md).

Through a transaction pooler, consecutive transactions of one client may run on
different server sessions, and a server session goes from client to client. So the
app keeps nothing in a session: no session advisory lock, no session ``SET``, no
``LISTEN``, no server-side cursor, no prepared statement. These tests check the
statements the protocol, the relay and the sweeper send, and run on a direct
connection as well as in the pooler pass (``-p tests.support.pgbouncer``, docs/testing.md),
where the rest of the protocol's, relay's and sweeper's modules run through it too.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_idempotency import outbox, retention, store, testing
from django_idempotency.models import IdempotencyRecord
from django_idempotency.outbox import relay
from django_idempotency.retention import sweeper
from django_idempotency.store.schema.functions import SWEEP_LOCK
from tests.support.concurrency import Runner
from tests.support.factories import create_window_day
from tests.support.pgbouncer import pgbouncer_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.pooled]

DAY = 86400.0
FP = "f" * 64

#: Statements that leave state in the server session, or need one session throughout.
SESSION_STATE = re.compile(
    r"pg_(try_)?advisory_(un)?lock(_shared)?\s*\(|\bLISTEN\b|\bUNLISTEN\b|\bPREPARE\b"
    r"|\bDECLARE\b|^\s*SET\s+(?!LOCAL\b|TRANSACTION\b)|^\s*RESET\b|\bCREATE\s+TEMP",
    re.IGNORECASE,
)


@contextmanager
def recorded(alias: str = "default") -> Iterator[list[tuple[str, Any]]]:
    """Every statement the connection of ``alias`` sends in the block, with its params."""
    statements: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(wrapper):
        yield statements


def assert_no_session_state(statements: list[tuple[str, Any]]) -> None:
    for sql, params in statements:
        if isinstance(params, dict) and params.get("take") is False:
            # A claim with owner presence off: its presence lock is behind ``take``.
            continue
        assert not SESSION_STATE.search(sql), sql
        if "set_config(" in sql.replace(" ", ""):
            # set_config(name, value, is_local): only transaction-local settings.
            assert "true)" in sql.replace(" ", "") or (params and params[-1] is True), (sql, params)


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /pooled", str(uuid.uuid4()))


def old_claims(days_back: tuple[int, ...]) -> list[store.Claim]:
    claims = []
    for days in days_back:
        with testing.travel(-days * DAY):
            create_window_day(DAY)
            won = store.claim(scope(), FP, lease=30, retention=DAY)
            assert isinstance(won, store.Claim)
            claims.append(won)
    return claims


@pytest.mark.skipif(not pgbouncer_port(), reason="the pooler pass: PGBOUNCER_PORT")
def test_the_connections_go_through_a_transaction_pooler():
    port = pgbouncer_port()
    assert str(connection.settings_dict["PORT"]) == port
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    admin = psycopg.connect(
        host=connection.settings_dict["HOST"],
        port=int(port or 0),
        user="postgres",
        dbname="pgbouncer",
        autocommit=True,
    )
    try:
        with admin.cursor() as cursor:
            cursor.execute("SHOW CONFIG")
            config = {row[0]: row[1] for row in cursor.fetchall()}
            cursor.execute("SHOW CLIENTS")
            columns = [col.name for col in cursor.description or ()]
            clients = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    finally:
        admin.close()
    assert config["pool_mode"] == "transaction"
    assert any(client["database"] == connection.settings_dict["NAME"] for client in clients)


def test_statements_are_never_prepared_server_side():
    connection.ensure_connection()
    raw = connection.connection
    assert raw.prepare_threshold is None
    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, psycopg.ClientCursor)


def test_the_protocol_and_the_relay_keep_no_session_state(alice, api, settings):
    if not pgbouncer_port():  # behind the pooler "auto" turns owner presence off itself
        settings.IDEMPOTENCY = {"OWNER_PRESENCE": False}
    key = str(uuid.uuid4())
    seen: list[str] = []
    outbox.register("worker.created")(lambda message, dedup_key: seen.append(dedup_key))
    try:
        with recorded() as statements:
            for _ in range(2):  # an execution, then a replay
                response = api.post("/heartbeat", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
                assert response.status_code == 201
            phased = api.post("/provision", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            assert phased.status_code == 201
            relay.deliver_batch()
    finally:
        outbox.unregister("worker.created")
    assert seen and statements
    assert_no_session_state(statements)


def test_the_sweeper_keeps_no_session_state_and_holds_its_lock_in_a_transaction(
    monkeypatch, settings
):
    if not pgbouncer_port():  # old claims of a pooled client: no presence lock
        settings.IDEMPOTENCY = {"OWNER_PRESENCE": False}
    old_claims((10, 11))
    sweeping_pid: list[int] = []
    holders: list[tuple[int, str]] = []
    real = sweeper._sweep_partitions

    def spy(conn: Any, report: Any) -> None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            sweeping_pid.append(cursor.fetchone()[0])
        observer = connection.copy()
        try:
            with observer.cursor() as cursor:
                cursor.execute(
                    "SELECT l.pid, a.state FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s "
                    # this test database's: other clients (other suites) share the server
                    "AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())",
                    list(SWEEP_LOCK),
                )
                holders.extend(cursor.fetchall())
        finally:
            observer.close()
        real(conn, report)

    monkeypatch.setattr(sweeper, "_sweep_partitions", spy)
    with recorded() as statements:
        report = retention.sweep()
    assert len(report.dropped) >= 2 and not report.errors and not report.skipped
    assert_no_session_state(statements)
    # The lock is held by another session, idle in its own transaction: taken and
    # released (by that transaction's end) on one server session even through a pooler.
    assert len(holders) == 1
    assert holders[0][0] != sweeping_pid[0] and holders[0][1] == "idle in transaction"
    with connection.cursor() as cursor:
        cursor.execute(  # this test database's: other clients share the server
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        )
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone()[0] == "0"


def partition_of(record_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM django_idempotency_record WHERE id = %s",
            [record_id],
        )
        return str(cursor.fetchone()[0])


def test_a_sweep_that_fails_in_a_transaction_leaves_no_lock_behind(monkeypatch):
    """Inside a caller's transaction a drop that cannot get its lock in time is rolled
    back alone and reported; the sweeper's lock is not left behind."""
    (old,) = old_claims((10,))
    name = partition_of(old.record_id)
    monkeypatch.setattr(sweeper, "LOCK_TIMEOUT", 0.2)
    reader = connection.copy()
    try:
        reader.set_autocommit(False)
        with reader.cursor() as cursor:  # the drop cannot get its lock in time
            cursor.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")
        with transaction.atomic():
            failed = retention.sweep()
        assert name in [e.split(":")[0] for e in failed.errors]
    finally:
        reader.rollback()
        reader.close()
    runner = Runner()
    runner.start(retention.sweep)  # another session: the lock must be free
    (report,) = runner.join()
    assert not report.skipped and name in {p.name for p in report.dropped}


def test_two_sweepers_at_once_do_the_work_once():
    old = old_claims((10, 11, 12))
    with testing.travel(-20 * DAY):  # an old day's record still inside its lease
        (live,) = old_claims((0,))
    assert store.extend(live, 3600)
    plan = retention.sweep(dry_run=True)
    expected = {p.name for p in plan.dropped}
    assert len(expected) >= 2 and plan.held
    barrier = threading.Barrier(2)
    runner = Runner()

    def sweeper() -> retention.SweepReport:
        barrier.wait(10)
        return retention.sweep()

    runner.start(sweeper)
    runner.start(sweeper)
    reports = runner.join()

    dropped = [p.name for r in reports for p in r.dropped]
    assert sorted(dropped) == sorted(expected)  # each once, by whichever ran it
    assert not any(r.errors for r in reports)
    assert IdempotencyRecord.objects.filter(pk=live.record_id).exists()
    assert not IdempotencyRecord.objects.filter(pk__in=[c.record_id for c in old]).exists()


def test_a_drop_that_waits_too_long_gives_up_and_is_done_later(monkeypatch):
    (old,) = old_claims((10,))
    name = partition_of(old.record_id)
    monkeypatch.setattr(sweeper, "LOCK_TIMEOUT", 0.2)
    reader = connection.copy()
    try:
        reader.set_autocommit(False)
        with reader.cursor() as cursor:  # an open transaction that read the old day
            cursor.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")
        report = retention.sweep()  # the drop's lock wait runs out
        assert name in [e.split(":")[0] for e in report.errors]
    finally:
        reader.rollback()
        reader.close()
    assert name in {p.name for p in retention.sweep().dropped}
