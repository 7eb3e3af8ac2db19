"""The claim: a request takes an idempotency key, or learns what holds it.

:func:`claim` is an insert against the unique constraint on (principal, endpoint,
key), committed on its own. On PostgreSQL one statement does the insert and, on
conflict, reads the existing row (one round trip for a first execution, a replay, a
409 or a 422); on the day-partitioned table a server-side function does the same under
an advisory lock of the scope. Elsewhere, an ORM insert in a short transaction, then a
read. Never SELECT-then-INSERT. A takeover of an expired lease (or of an owner whose
session is gone), and the reuse of a record past its retention window, are conditional
UPDATEs (or DELETE then INSERT) re-checked by the database: among concurrent
contenders exactly one wins.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from django.db import (
    DatabaseError,
    IntegrityError,
    connections,
    transaction,
)
from django.db.models import F, Q
from django.db.models.functions import Greatest

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock, presence
from django_idempotency.store.catalog import forget as forget_table_kind
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.fingerprints import same_request
from django_idempotency.store.isolation import (
    NOT_READ_COMMITTED,
    SERIALIZATION_FAILURE,
    claim_transaction,
    own_transaction,
    strict_databases,
)
from django_idempotency.store.routing import record_database
from django_idempotency.store.rows import (
    existing_from_row,
    fetch,
    now_value,
    pg_params,
    scope_filter,
    sqlstate_of,
    utc_or_none,
)
from django_idempotency.store.sql import (
    PG_CLAIM_SQL,
    PG_FORGET_SQL,
    PG_PARTITIONED_CLAIM_SQL,
    PG_RESTAMP_SQL,
    PG_TAKEOVER_SQL,
)
from django_idempotency.store.values import (
    BY_LEASE,
    BY_OPERATOR,
    BY_PRESENCE,
    Claim,
    Existing,
    Scope,
)

#: Attempts at "claim, or settle on the row we collided with" before answering 409.
_MAX_ROUNDS = 5


#: Seconds a plain-table claim may have queued behind an uncommitted row with the same
#: scope before its times are taken again (``PG_RESTAMP_SQL``), as a fraction of the
#: lease and at most this long.
_RESTAMP_AFTER = 0.05


def claim(
    scope: Scope,
    fingerprint: str,
    *,
    lease: float,
    retention: float,
    using: str | None = None,
    request_path: str = "",
) -> Claim | Existing:
    """Try to claim ``scope`` for a request whose fingerprint is ``fingerprint``.

    Args:
        scope: the record's identity.
        fingerprint: the stored form from ``fingerprint.compute`` (``fingerprints``).
        lease: seconds the claim holds off duplicates before it can be taken over.
        retention: seconds a completed response is kept and replayed.
        using: database alias; by default the router's choice for writes.
        request_path: the concrete path the request was sent to, kept with a new
            record for operators (at most 255 characters; see
            ``protocol.begin.request_path``); not part of the scope or fingerprint.

    Returns:
        A :class:`Claim` when this request owns the key: a new record, a record past
        its retention window reused, or an expired lease of the same request taken
        over. Otherwise the :class:`Existing` record that stands: completed (replay or
        422), or claimed with a live lease (409).

    Raises:
        django.db.DatabaseError: the database failed; nothing was claimed.
    """
    using = using or record_database()
    if not own_transaction(connections[using]):
        # Inside a transaction we did not open (TestCase, ATOMIC_REQUESTS without the
        # exemption, manual transactions) the claim is not committed until that
        # transaction is.
        won = _claim(scope, fingerprint, lease, retention, using, request_path)
        if isinstance(won, Claim):
            return dataclasses.replace(won, committed=False)
        return won
    return _claim(scope, fingerprint, lease, retention, using, request_path)


def _claim(
    scope: Scope,
    fingerprint: str,
    lease: float,
    retention: float,
    using: str,
    request_path: str,
) -> Claim | Existing:
    token = uuid.uuid4()
    existing: Existing | None = None
    for _round in range(_MAX_ROUNDS):
        won, existing = _insert(using, scope, fingerprint, token, lease, retention, request_path)
        if won is not None:
            return won
        if existing is None:  # released between the insert and the read: again
            continue
        if existing.expired and (existing.completed or existing.lease_remaining <= 0):
            _forget_expired(using, existing)
            continue
        if (
            not existing.completed
            and existing.lease_remaining <= 0
            and same_request(existing.fingerprint, fingerprint)
        ):
            taken = _take_over(using, existing, token, lease)
            if taken is not None:
                present, by_operator = taken
                won = Claim(
                    scope,
                    existing.record_id,
                    token,
                    True,
                    existing.recovery_point,
                    using,
                    lease=lease,
                    present=present,
                    takeover_cause=BY_OPERATOR if by_operator else BY_LEASE,
                )
                if present:
                    presence.hold(won)
                return won
            continue
        return existing
    # Raced on every round (claims released or taken over under us): in flight.
    return Existing(0, RecordState.CLAIMED, fingerprint, 1.0, False, None)


def _insert(
    using: str,
    scope: Scope,
    fingerprint: str,
    token: uuid.UUID,
    lease: float,
    retention: float,
    request_path: str,
) -> tuple[Claim | None, Existing | None]:
    connection = connections[using]
    if connection.vendor == "postgresql":
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
        # A day-partitioned table (docs/retention.md) has no unique index to conflict
        # with: a server-side function locks the scope, looks it up, then inserts.
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
                return None, None
            forget_table_kind()  # perhaps a migration changed the table under us
            if take:  # a statement that failed after taking the lock must not keep it
                presence.unlock(using, scope)
            raise
        if row is None:
            return None, fetch(scope, using=using)
        data = dict(zip(columns, row, strict=True))
        if data["won"]:
            won = Claim(
                scope,
                data["id"],
                token,
                bool(data["by_presence"]),
                data["recovery_point"] or "",
                using,
                lease=lease,
                present=bool(data["present"]),
                by_presence=bool(data["by_presence"]),
                sweep_after=utc_or_none(data.get("sweep_after")),
                takeover_cause=BY_PRESENCE if data["by_presence"] else "",
            )
            if won.present:
                presence.hold(won)
            waited = data.get("waited") or 0.0
            if waited > min(_RESTAMP_AFTER, lease / 10) and not _restamp(
                connection, won, retention
            ):
                presence.ensure_released(won)
                return None, None  # taken over in between: settle on it next round
            return won, None
        return None, existing_from_row(data)
    if not connection.in_atomic_block:
        # Look before writing: a duplicate of a held key then only reads. On SQLite a
        # write takes the database's one write lock, and a view that has read in its
        # transaction fails at once, whatever the busy timeout, if it then writes
        # while another connection holds that lock
        # (https://www.sqlite.org/lang_transaction.html); a duplicate that reads waits
        # for nothing and does not fail the view it duplicates.
        existing = fetch(scope, using=using)
        if existing is not None:
            return None, existing
    now = clock.app_now()
    window_end = now + dt.timedelta(seconds=max(retention, lease))
    try:
        with transaction.atomic(using=using):
            record = IdempotencyRecord.objects.using(using).create(
                **scope_filter(scope),
                fingerprint=fingerprint,
                request_path=request_path,
                owner_token=token,
                lease_until=clock.to_db(now + dt.timedelta(seconds=lease), connection),
                created_at=clock.to_db(now, connection),
                expires_at=clock.to_db(window_end, connection),
                sweep_after=clock.to_db(window_end, connection),
            )
    except IntegrityError:
        return None, fetch(scope, using=using)
    return Claim(scope, record.pk, token, False, "", using, lease=lease), None


def _restamp(connection: Any, claim: Claim, retention: float) -> bool:
    """Take a plain-table claim's times again after its INSERT queued (fenced).

    The INSERT's values were computed when the statement started; it then waited for
    an uncommitted row with the same scope, whose transaction rolled back. Returns
    whether the claim is still ours.
    """
    params = {
        "id": claim.record_id,
        "token": claim.owner_token,
        "lease": claim.lease,
        "retention": retention,
        "clock_offset": clock.offset(),
    }
    with connection.cursor() as cursor:
        cursor.execute(PG_RESTAMP_SQL, params)
        return bool(cursor.rowcount == 1)


def _forget_expired(using: str, existing: Existing) -> None:
    """Delete a record past its retention window, so the key can be claimed anew.

    The next round inserts a fresh row (a new id: the record's generation, part of
    the outbox's default dedup keys). Conditional on the row being unchanged since it
    was read, and still past its window, so a concurrent contender's fresh claim is
    never deleted. On the partitioned table the claim function does this itself.
    """
    connection = connections[using]
    if is_partitioned(connection):
        return
    if connection.vendor == "postgresql":
        params = {
            "id": existing.record_id,
            "token": existing.owner_token,
            "clock_offset": clock.offset(),
        }
        with connection.cursor() as cursor:
            cursor.execute(PG_FORGET_SQL, params)
        return
    IdempotencyRecord.objects.using(using).filter(
        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now_value(using)),
        pk=existing.record_id,
        owner_token=existing.owner_token,  # type: ignore[misc]  # set on every row read
        expires_at__lte=now_value(using),
    )._raw_delete(using)


def _take_over(
    using: str, existing: Existing, token: uuid.UUID, lease: float
) -> tuple[bool, bool] | None:
    """Install ``token`` on a claim whose lease ran out, if nobody changed it since.

    The window is pushed to end no earlier than the new lease. On PostgreSQL a row
    locked by the stalled owner's open transaction is skipped, never waited for.
    Returns ``None`` when another request won, else ``(present, by_operator)``: whether
    the new owner's session holds the presence lock, and whether the lease had been
    ended by an operator (``operators.end_leases``) rather than run out.
    """
    connection = connections[using]
    if connection.vendor == "postgresql":
        params = {
            "id": existing.record_id,
            "token": existing.owner_token,
            "recovery_point": existing.recovery_point,
            "new_token": token,
            "lease": lease,
            "clock_offset": clock.offset(),
            "take": presence.takes(connection),
        }
        with connection.cursor() as cursor:
            cursor.execute(PG_TAKEOVER_SQL, params)
            row = cursor.fetchone()
        return None if row is None else (bool(row[0]), bool(row[1]))
    new_lease_until = now_value(using, lease)
    updated = (
        IdempotencyRecord.objects.using(using)
        .filter(
            pk=existing.record_id,
            state=RecordState.CLAIMED,
            owner_token=existing.owner_token,  # type: ignore[misc]  # set on every row read
            recovery_point=existing.recovery_point,
            lease_until__lte=now_value(using),
        )
        .update(
            owner_token=token,
            lease_until=new_lease_until,
            expires_at=Greatest(F("expires_at"), new_lease_until),
        )
    )
    return (False, existing.ended_by_operator) if updated == 1 else None
