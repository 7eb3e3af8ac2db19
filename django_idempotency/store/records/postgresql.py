"""The claim's statements on PostgreSQL (:class:`PostgresRecords`); the SQL is ``store.sql``."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from django.db import DatabaseError

from django_idempotency.exceptions import HeartbeatUnavailable, LeaseLost
from django_idempotency.store import clock, presence, tenants
from django_idempotency.store.catalog import forget as forget_table_kind
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.isolation import (
    NOT_READ_COMMITTED,
    SERIALIZATION_FAILURE,
    claim_transaction,
    strict_databases,
    stricter_than_read_committed,
)
from django_idempotency.store.records.base import RecordStore, fenced_errors, taken_over
from django_idempotency.store.rows import (
    existing_from_row,
    pg_params,
    scope_filter,
    sqlstate_of,
)
from django_idempotency.store.sql import (
    FENCED_SQLSTATE,
    PG_CLAIM_SQL,
    PG_EXTEND_SQL,
    PG_FORGET_SQL,
    PG_PARTITIONED_CLAIM_SQL,
    PG_RELEASE_UNLOCK_SQL,
    PG_RESTAMP_SQL,
    PG_TAKEOVER_SQL,
    complete_bound_sql,
    complete_call_sql,
)
from django_idempotency.store.values import BY_PRESENCE, Claim, Existing, Headers, Scope

#: Seconds a plain-table claim may have queued behind an uncommitted row with the same
#: scope before its times are taken again (``PG_RESTAMP_SQL``), as a fraction of the
#: lease and at most this long.
_RESTAMP_AFTER = 0.05

#: Stored bodies from this many bytes on are sent to PostgreSQL as a binary parameter,
#: bound on the server, instead of in the query's text: Django's default client-side
#: binding escapes a body into hexadecimal text inside the query, which holds about
#: 4.5 times the body in memory at once; bound, the body is sent as it is (about 1 time;
#: docs/benchmarks.md, "Memory per request").
BOUND_BODY_BYTES = 64 * 1024


class PostgresRecords(RecordStore):
    """The claim on PostgreSQL: one statement inserts or reads the facts (one round trip).

    The plain table's statement is an ``INSERT ... ON CONFLICT DO NOTHING`` against the
    unique index; the day-partitioned table (docs/retention.md), which has none, calls
    a server-side function that locks the scope, looks it up, then inserts. Both say
    whether the owner of a claimed record is gone (``sql.owner_gone``). A new owner on
    a direct connection holds the record's presence lock (``store.presence``), which
    its completion or release drops in the same statement. The completion runs the
    server-side function ``django_idempotency_complete`` (planned once per session); the
    heartbeat commits on a second connection while the view's transaction is open.
    """

    def insert(
        self,
        scope: Scope,
        fingerprint: str,
        token: uuid.UUID,
        *,
        lease: float,
        retention: float,
        request_path: str,
    ) -> Claim | Existing | None:
        """``PG_CLAIM_SQL``, or the claim function on the partitioned table."""
        connection = self.connection
        take = presence.takes(connection)
        params = pg_params(
            scope,
            fingerprint=fingerprint,
            token=token,
            lease=lease,
            retention=retention,
            take=take,
            test=presence.tests(connection),
            request_path=request_path,
        )
        sql = PG_PARTITIONED_CLAIM_SQL if is_partitioned(connection) else PG_CLAIM_SQL
        try:
            with claim_transaction(connection), connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
                columns = [column.name for column in cursor.description or ()]
        except DatabaseError as exc:
            if (
                sqlstate_of(exc) in (NOT_READ_COMMITTED, SERIALIZATION_FAILURE)
                and not connection.in_atomic_block
                and connection.alias not in strict_databases
            ):
                # The server's default isolation is stricter than Django was told
                # (ALTER DATABASE/ROLE ... SET default_transaction_isolation): the
                # partitioned claim refused it, or the plain table's INSERT could not
                # serialize behind a concurrent claim. From now on this database's
                # claims open their own READ COMMITTED transaction.
                strict_databases.add(connection.alias)
                return None
            forget_table_kind()  # perhaps a migration changed the table under us
            if take:  # a statement that failed after taking the lock must not keep it
                presence.unlock(self.using, scope)
            raise
        if row is None:  # it committed after the statement's snapshot: read again
            return None
        data = dict(zip(columns, row, strict=True))
        if not data["won"]:
            return existing_from_row(data)
        won = Claim(
            scope,
            data["id"],
            token,
            False,
            "",
            self.using,
            lease=lease,
            present=bool(data["present"]),
        )
        if won.present:
            presence.hold(won)
        waited = data.get("waited") or 0.0
        if waited > min(_RESTAMP_AFTER, lease / 10) and not self._restamp(won, retention):
            presence.ensure_released(won)
            return None  # taken over in between: settle on it next round
        return won

    def _restamp(self, claim: Claim, retention: float) -> bool:
        """Take a plain-table claim's times again after its INSERT queued (fenced).

        The INSERT's values were computed when the statement started; it then waited
        for an uncommitted row with the same scope, whose transaction rolled back.
        Returns whether the claim is still ours.
        """
        params: dict[str, Any] = {
            "id": claim.record_id,
            "token": claim.owner_token,
            "lease": claim.lease,
            "retention": retention,
            "clock_offset": clock.offset(),
        }
        with self.connection.cursor() as cursor:
            cursor.execute(PG_RESTAMP_SQL, params)
            return bool(cursor.rowcount == 1)

    def take_over(
        self, scope: Scope, record: Existing, token: uuid.UUID, *, lease: float, cause: str
    ) -> Claim | None:
        """``PG_TAKEOVER_SQL``; the new owner holds the presence lock where it can."""
        params: dict[str, Any] = {
            "id": record.record_id,
            "token": record.owner_token,
            "recovery_point": record.recovery_point,
            "by_presence": cause == BY_PRESENCE,
            "new_token": token,
            "lease": lease,
            "clock_offset": clock.offset(),
            "take": presence.takes(self.connection),
        }
        with self.connection.cursor() as cursor:
            cursor.execute(PG_TAKEOVER_SQL, params)
            row = cursor.fetchone()
        if row is None:
            return None
        won = taken_over(
            scope, record, token, self.using, lease=lease, cause=cause, present=bool(row[0])
        )
        if won.present:
            presence.hold(won)
        return won

    def forget(self, record: Existing) -> None:
        """``PG_FORGET_SQL``: never waits for a row another transaction holds."""
        params = {
            "id": record.record_id,
            "token": record.owner_token,
            "clock_offset": clock.offset(),
        }
        with self.connection.cursor() as cursor:
            cursor.execute(PG_FORGET_SQL, params)

    def complete(self, claim: Claim, status: int, headers: Headers, body: bytes | None) -> None:
        """The completion function, which raises ``FENCED_SQLSTATE`` when its fence matches no row.

        Bodies from :data:`BOUND_BODY_BYTES` on are bound on the server (psycopg 3).
        """
        connection = self.connection
        params: dict[str, Any] = {
            "status": status,
            "headers": json.dumps([list(pair) for pair in headers]),
            "body": body,
            "id": claim.record_id,
            "token": claim.owner_token,
            "grace": claim.lease,
            "clock_offset": clock.offset(),
        }
        unlock = claim.present and presence.holds(claim)  # the lock goes in the statement
        if unlock:
            params.update(scope_filter(claim.scope))
        bound = body is not None and len(body) >= BOUND_BODY_BYTES and _binds()
        try:
            with fenced_errors(claim):
                if bound:
                    with _bound_cursor(connection) as cursor:
                        cursor.execute(complete_bound_sql(unlock=unlock), params)
                else:
                    with connection.cursor() as cursor:
                        cursor.execute(complete_call_sql(unlock=unlock), params)
        except LeaseLost as lost:
            if unlock and sqlstate_of(lost.__cause__) == FENCED_SQLSTATE:
                presence.dropped(claim)  # the function released the lock, then raised
            raise
        if unlock:
            presence.dropped(claim)

    def release(self, claim: Claim) -> bool:
        """One fenced ``DELETE``; it drops the presence lock too where the claim holds it."""
        connection = self.connection
        if not (claim.present and presence.holds(claim) and not connection.in_atomic_block):
            return super().release(claim)
        params: dict[str, Any] = {
            "id": claim.record_id,
            "token": claim.owner_token,
            **scope_filter(claim.scope),
        }
        with connection.cursor() as cursor:
            cursor.execute(PG_RELEASE_UNLOCK_SQL, params)
            deleted = cursor.fetchone()[0]
        presence.dropped(claim)
        return bool(deleted)

    def extend(self, claim: Claim, seconds: float) -> bool:
        """``PG_EXTEND_SQL``, on a second connection while the view's transaction is open.

        A committed claim is extended from a second, short-lived connection (in the
        request's tenant schema) when the view's transaction is open, so other
        requests see the new lease at once; an uncommitted one exists only in this
        connection's transaction, and is extended there.
        """
        connection = self.connection
        params: dict[str, Any] = {
            "id": claim.record_id,
            "token": claim.owner_token,
            "seconds": seconds,
            "clock_offset": clock.offset(),
        }
        side = connection.in_atomic_block and claim.committed
        if side and stricter_than_read_committed(connection):
            raise HeartbeatUnavailable(
                f"extend_lease() cannot work on database {claim.using!r}: its isolation level "
                "is above READ COMMITTED, so a heartbeat committed beside this request's "
                "transaction would make the request's own completion fail. Give this view a "
                "lease longer than its longest run, or use READ COMMITTED for this database."
            )
        target = tenants.copy_of(connection) if side else connection
        try:
            with target.cursor() as cursor:
                cursor.execute(PG_EXTEND_SQL, params)
                return bool(cursor.rowcount == 1)
        finally:
            if target is not connection:
                target.close()


def _binds() -> bool:
    """Whether Django drives psycopg 3, which can bind a body on the server."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


@functools.cache
def _unprepared_cursor_class() -> type[Any]:
    import psycopg

    class UnpreparedCursor(psycopg.Cursor[Any]):
        """Binds on the server, never prepares: no named statement a pooler could lose."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            # psycopg prepares a query run often on one connection (prepare_threshold);
            # behind PgBouncer in transaction pooling, the next server may not have it.
            return super().execute(query, params, **{**kwargs, "prepare": False})

    return UnpreparedCursor


def _bound_cursor(connection: Any) -> Any:
    """A cursor on ``connection`` that binds its parameters on the server (psycopg 3).

    Never prepared (safe behind a transaction pooler). Wrapped as Django wraps its own
    cursors: its execute wrappers (the write guard) and its query log see the
    statement.
    """
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = _unprepared_cursor_class()(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)
