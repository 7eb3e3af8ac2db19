"""The claim's statements on PostgreSQL (:class:`PostgresRecords`); the SQL is ``store.sql``."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import DatabaseError

from django_idempotency.store import clock, presence
from django_idempotency.store.catalog import forget as forget_table_kind
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.isolation import (
    NOT_READ_COMMITTED,
    SERIALIZATION_FAILURE,
    claim_transaction,
    own_transaction,
    strict_databases,
)
from django_idempotency.store.records.base import RecordStore, taken_over
from django_idempotency.store.rows import existing_from_row, pg_params, sqlstate_of, utc_or_none
from django_idempotency.store.sql import (
    PG_CLAIM_SQL,
    PG_FORGET_SQL,
    PG_PARTITIONED_CLAIM_SQL,
    PG_RESTAMP_SQL,
    PG_TAKEOVER_SQL,
)
from django_idempotency.store.values import BY_PRESENCE, Claim, Existing, Scope

#: Seconds a plain-table claim may have queued behind an uncommitted row with the same
#: scope before its times are taken again (``PG_RESTAMP_SQL``), as a fraction of the
#: lease and at most this long.
_RESTAMP_AFTER = 0.05


class PostgresRecords(RecordStore):
    """The claim on PostgreSQL: one statement inserts or reads the facts (one round trip).

    The plain table's statement is an ``INSERT ... ON CONFLICT DO NOTHING`` against the
    unique index; the day-partitioned table (docs/retention.md), which has none, calls
    a server-side function that locks the scope, looks it up, then inserts. Both say
    whether the owner of a claimed record is gone (``sql.owner_gone``). A new owner on
    a direct connection holds the record's presence lock (``store.presence``).
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
            # Its own transaction (not a caller's): its COMMIT need not wait for the
            # WAL flush, the view's later COMMIT flushes it (docs/benchmarks.md).
            async_commit=own_transaction(connection),
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
            sweep_after=utc_or_none(data.get("sweep_after")),
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
