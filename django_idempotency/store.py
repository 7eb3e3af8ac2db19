"""Every SQL statement of the claim / complete protocol (docs/concepts.md). Nothing HTTP.

* :func:`claim`: an insert against the unique constraint on (principal, endpoint,
  key), committed on its own. On PostgreSQL one statement does the insert and, on
  conflict, reads the existing row (one round trip for a first execution, a replay, a
  409 or a 422). Elsewhere, an ORM insert in a short transaction, then a read.
  Never SELECT-then-INSERT.
* Takeover of an expired lease, and reuse of a record past its retention window, are
  conditional UPDATEs (owner token, lease and recovery point re-checked by the
  database): among concurrent contenders exactly one wins.
* :func:`complete`: inside the caller's atomic block, an UPDATE fenced by the owner
  token. Zero rows means the lease was lost: :class:`LeaseLost` is raised so the
  caller's block, business writes included, rolls back.
* :func:`release`: delete a claim we own (failure before any effect).
* :func:`advance`: a phase finished (recovery point), fenced; :func:`suspend`: end
  the lease of a phased claim that failed after a phase, so a retry resumes it.
* :func:`extend`: heartbeat, pushing ``lease_until`` forward; commits at once.

Leases and expiry follow one clock: see ``django_idempotency.clock``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    connections,
    transaction,
)
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest

from django_idempotency import clock, presence
from django_idempotency._pg import (
    PG_CLAIM_COLUMNS,
    PG_CLAIM_SQL,
    PG_COMPLETE_PRUNED_SQL,
    PG_COMPLETE_PRUNED_UNLOCK_SQL,
    PG_COMPLETE_SQL,
    PG_COMPLETE_UNLOCK_SQL,
    PG_EXTEND_SQL,
    PG_FETCH_SQL,
    PG_FORGET_SQL,
    PG_RELEASE_UNLOCK_SQL,
    PG_RESTAMP_SQL,
    PG_TAKEOVER_SQL,
    complete_call_sql,
    pg_now,
)
from django_idempotency._pg_partitioned import (
    FENCED_SQLSTATE,
    PG_PARTITIONED_CLAIM_COLUMNS,
    PG_PARTITIONED_CLAIM_SQL,
    has_completion_function,
    is_partitioned,
)
from django_idempotency._pg_partitioned import forget as forget_table_kind
from django_idempotency.bodies import decode_body, encode_body
from django_idempotency.claims import (
    BY_LEASE,
    BY_OPERATOR,
    BY_PRESENCE,
    Claim,
    Existing,
    Headers,
    HeartbeatUnavailable,
    LeaseLost,
    Scope,
    StoredResponse,
)
from django_idempotency.databases import record_database
from django_idempotency.models import IdempotencyRecord, RecordState

__all__ = [
    "Claim",
    "Existing",
    "Headers",
    "HeartbeatUnavailable",
    "LeaseLost",
    "Scope",
    "StoredResponse",
    "abandon",
    "advance",
    "claim",
    "complete",
    "database_for_write",
    "decode_body",
    "encode_body",
    "extend",
    "fetch",
    "release",
    "stricter_than_read_committed",
    "suspend",
]

logger = logging.getLogger("django_idempotency")

#: SQLSTATE of "no partition of relation ... found for row" (check_violation).
_NO_PARTITION = "23514"

#: Attempts at "claim, or settle on the row we collided with" before answering 409.
_MAX_ROUNDS = 5

#: SQLSTATE raised by the partitioned claim function outside READ COMMITTED.
_NOT_READ_COMMITTED = "0A000"
#: Aliases whose server turned out to default to a stricter isolation level.
_strict_databases: set[str] = set()

#: SQLSTATE of serialization_failure: at REPEATABLE READ or SERIALIZABLE, a fenced
#: statement found our record changed since the view's snapshot (a takeover).
_SERIALIZATION_FAILURE = "40001"

#: Seconds a plain-table claim may have queued behind an uncommitted row with the same
#: scope before its times are taken again (``PG_RESTAMP_SQL``), as a fraction of the
#: lease and at most this long.
_RESTAMP_AFTER = 0.05


def database_for_write() -> str:
    """The database alias the router picks for writing idempotency records."""
    return record_database()


def _now_value(using: str, plus_seconds: float = 0.0) -> Any:
    """Now (+ ``plus_seconds``) as the store's clock gives it, for ORM queries."""
    if connections[using].vendor == "postgresql":
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])
    return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), connections[using])


def _headers_from_db(value: Any) -> Headers:
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return [(str(name), str(val)) for name, val in value or ()]


def _existing(row: dict[str, Any]) -> Existing:
    response = None
    if row["state"] == RecordState.COMPLETED:
        raw = row["response_body"]
        response = StoredResponse(
            status=int(row["response_status"]),
            headers=_headers_from_db(row["response_headers"]),
            body=b"" if raw is None else decode_body(raw),
            replayable=raw is not None,
        )
    return Existing(
        record_id=row["id"],
        state=row["state"],
        fingerprint=row["fingerprint"],
        lease_remaining=float(row["lease_remaining"]),
        expired=bool(row["expired"]),
        response=response,
        owner_token=row["owner_token"],
        recovery_point=row["recovery_point"] or "",
        owner_pid=row.get("owner_pid"),
        ended_by_operator=bool(row.get("ended_by_operator")),
    )


def _scope_filter(scope: Scope) -> dict[str, str]:
    return {"principal": scope.principal, "endpoint": scope.endpoint, "key": scope.key}


def _pg_params(scope: Scope, **extra: Any) -> dict[str, Any]:
    return {**_scope_filter(scope), "clock_offset": clock.offset(), **extra}


def fetch(scope: Scope, *, using: str | None = None) -> Existing | None:
    """Read the record for ``scope`` with one SELECT; ``None`` if there is none."""
    using = using or database_for_write()
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(PG_FETCH_SQL, _pg_params(scope))
            row = cursor.fetchone()
            if row is None:
                return None
            columns = [col.name for col in cursor.description]
        return _existing(dict(zip(columns, row, strict=True)))
    found = (
        IdempotencyRecord.objects.using(using)
        .filter(**_scope_filter(scope))
        .values(
            "id",
            "owner_token",
            "state",
            "fingerprint",
            "recovery_point",
            "lease_until",
            "expires_at",
            "response_status",
            "response_headers",
            "response_body",
            "created_at",
        )
        .first()
    )
    if found is None:
        return None
    values: dict[str, Any] = dict(found)
    now = clock.app_now()
    lease_until = clock.from_db(values["lease_until"], connection)
    values["ended_by_operator"] = values["lease_until"] == values["created_at"]
    values["lease_remaining"] = (lease_until - now).total_seconds()
    values["expired"] = clock.from_db(values["expires_at"], connection) <= now
    return _existing(values)


def claim(
    scope: Scope,
    fingerprint: str,
    *,
    lease: float,
    retention: float,
    using: str | None = None,
) -> Claim | Existing:
    """Try to claim ``scope`` for a request whose fingerprint is ``fingerprint``.

    Args:
        scope: the record's identity.
        fingerprint: 64 hex characters from ``fingerprint.compute``.
        lease: seconds the claim holds off duplicates before it can be taken over.
        retention: seconds a completed response is kept and replayed.
        using: database alias; by default the router's choice for writes.

    Returns:
        A :class:`Claim` when this request owns the key: a new record, a record past
        its retention window reused, or an expired lease with the same fingerprint
        taken over. Otherwise the :class:`Existing` record that stands: completed
        (replay or 422), or claimed with a live lease (409).

    Raises:
        django.db.DatabaseError: the database failed; nothing was claimed.
    """
    using = using or database_for_write()
    if not own_transaction(connections[using]):
        # Inside a transaction we did not open (TestCase, ATOMIC_REQUESTS without the
        # exemption, manual transactions) the claim is not committed until that
        # transaction is.
        won = _claim(scope, fingerprint, lease, retention, using)
        if isinstance(won, Claim):
            return dataclasses.replace(won, committed=False)
        return won
    return _claim(scope, fingerprint, lease, retention, using)


def _claim(
    scope: Scope, fingerprint: str, lease: float, retention: float, using: str
) -> Claim | Existing:
    token = uuid.uuid4()
    existing: Existing | None = None
    for _round in range(_MAX_ROUNDS):
        won, existing = _insert(using, scope, fingerprint, token, lease, retention)
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
            and existing.fingerprint == fingerprint
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
) -> tuple[Claim | None, Existing | None]:
    connection = connections[using]
    if connection.vendor == "postgresql":
        take = presence.takes(connection)
        params = _pg_params(
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
        )
        # A day-partitioned table (docs/retention.md) has no unique index to conflict
        # with: a server-side function locks the scope, looks it up, then inserts.
        if is_partitioned(connection):
            sql, columns = PG_PARTITIONED_CLAIM_SQL, PG_PARTITIONED_CLAIM_COLUMNS
        else:
            sql, columns = PG_CLAIM_SQL, PG_CLAIM_COLUMNS
        try:
            with _claim_transaction(connection), connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
        except IntegrityError as exc:
            if _sqlstate(exc) == _NO_PARTITION:
                # Today's partition was attached by a concurrent claim after this
                # statement planned its insert: the next round sees it.
                return None, None
            raise
        except DatabaseError as exc:
            if (
                _sqlstate(exc) in (_NOT_READ_COMMITTED, _SERIALIZATION_FAILURE)
                and not connection.in_atomic_block
                and connection.alias not in _strict_databases
            ):
                # The server's default isolation is stricter than Django was told
                # (ALTER DATABASE/ROLE ... SET default_transaction_isolation): the
                # partitioned claim refused it, or the plain table's INSERT could not
                # serialize behind a concurrent claim. From now on this database's
                # claims open their own READ COMMITTED transaction.
                _strict_databases.add(connection.alias)
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
                sweep_after=_utc(data.get("sweep_after")),
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
        return None, _existing(data)
    now = clock.app_now()
    window_end = now + dt.timedelta(seconds=max(retention, lease))
    try:
        with transaction.atomic(using=using):
            record = IdempotencyRecord.objects.using(using).create(
                **_scope_filter(scope),
                fingerprint=fingerprint,
                owner_token=token,
                lease_until=clock.to_db(now + dt.timedelta(seconds=lease), connection),
                created_at=clock.to_db(now, connection),
                expires_at=clock.to_db(window_end, connection),
                sweep_after=clock.to_db(window_end, connection),
            )
    except IntegrityError:
        return None, fetch(scope, using=using)
    return Claim(scope, record.pk, token, False, "", using, lease=lease), None


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """A naive UTC datetime from SQL (``... AT TIME ZONE 'UTC'``) made aware; ``None`` kept."""
    return None if value is None else clock.utc_from_naive(value)


def own_transaction(connection: Any) -> bool:
    """Whether a statement on ``connection`` commits on its own (autocommit, no block).

    False inside an ``atomic()`` block and with manual transactions
    (``set_autocommit(False)``, ``AUTOCOMMIT: False``): the statement then joins the
    caller's transaction, which may hold the caller's own writes.
    """
    return not connection.in_atomic_block and connection.get_autocommit()


def _claim_transaction(connection: Any) -> AbstractContextManager[None]:
    """The transaction a PostgreSQL claim statement runs in.

    Normally none of its own: the statement commits at once (autocommit). Inside a
    caller's atomic block (``ATOMIC_REQUESTS``, a test case) the claim cannot commit on
    its own; a savepoint at least keeps a failure from poisoning that block. When the
    database's isolation level is stricter than READ COMMITTED, the claim opens its own
    READ COMMITTED transaction: its look-up must see every row committed before the
    scope's lock was granted, and a snapshot taken earlier would not.
    """
    if not own_transaction(connection):  # an atomic block, or manual transactions
        block: AbstractContextManager[None] = transaction.atomic(using=connection.alias)
        return block
    if stricter_than_read_committed(connection):
        return _read_committed(connection)
    return nullcontext()


@contextmanager
def _read_committed(connection: Any) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    try:
        yield
    except BaseException:
        with suppress(DatabaseError), connection.cursor() as cursor:  # keep the cause
            cursor.execute("ROLLBACK")
        raise
    with connection.cursor() as cursor:
        cursor.execute("COMMIT")


def stricter_than_read_committed(connection: Any) -> bool:
    """Whether transactions on ``connection`` run above READ COMMITTED.

    ``True`` for PostgreSQL databases whose ``OPTIONS["isolation_level"]`` is
    REPEATABLE READ or SERIALIZABLE, and for those whose server default is (``ALTER
    DATABASE/ROLE ... SET default_transaction_isolation``), once a claim found it out;
    ``False`` for every other database.
    """
    if connection.vendor != "postgresql":
        return False
    if connection.alias in _strict_databases:  # the server's default, seen by a claim
        return True
    level = connection.settings_dict.get("OPTIONS", {}).get("isolation_level")
    if level is None:
        return False
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    try:
        return IsolationLevel(level) in (
            IsolationLevel.REPEATABLE_READ,
            IsolationLevel.SERIALIZABLE,
        )
    except ValueError:
        return False


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
        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=_now_value(using)),
        pk=existing.record_id,
        owner_token=existing.owner_token,  # type: ignore[misc]  # set on every row read
        expires_at__lte=_now_value(using),
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
    new_lease_until = _now_value(using, lease)
    updated = (
        IdempotencyRecord.objects.using(using)
        .filter(
            pk=existing.record_id,
            state=RecordState.CLAIMED,
            owner_token=existing.owner_token,  # type: ignore[misc]  # set on every row read
            recovery_point=existing.recovery_point,
            lease_until__lte=_now_value(using),
        )
        .update(
            owner_token=token,
            lease_until=new_lease_until,
            expires_at=Greatest(F("expires_at"), new_lease_until),
        )
    )
    return (False, existing.ended_by_operator) if updated == 1 else None


def _fenced(claim: Claim) -> Any:
    return IdempotencyRecord.objects.using(claim.using).filter(
        pk=claim.record_id, owner_token=claim.owner_token, state=RecordState.CLAIMED
    )


def _sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a Django database error (that of the driver's error it wraps)."""
    return getattr(getattr(exc, "__cause__", None), "sqlstate", None)


@contextmanager
def _fenced_errors(claim: Claim) -> Iterator[None]:
    """Turn a serialization failure of a fenced write into :class:`LeaseLost`.

    At REPEATABLE READ or SERIALIZABLE, PostgreSQL refuses to update a row changed
    since the transaction's snapshot instead of re-checking the fence: the record was
    taken over (or its lease ended by an operator) while the view ran.
    """
    try:
        yield
    except DatabaseError as exc:
        sqlstate = _sqlstate(exc)
        if sqlstate == _SERIALIZATION_FAILURE:
            raise LeaseLost(
                f"record {claim.record_id}: changed by another request while this one ran"
            ) from exc
        if sqlstate == FENCED_SQLSTATE:
            raise LeaseLost(
                f"record {claim.record_id}: the lease was lost before completion"
            ) from exc
        raise


def commits_with_completion(connection: Any) -> bool:
    """Whether :func:`complete` can send the ``COMMIT`` with the completion, on the wire.

    Asked by the caller of ``complete(..., commit=True)`` after it made sure that the
    transaction is its own outermost block. ``True`` on PostgreSQL with psycopg 3 and
    Django's default client-side binding (several statements in one simple query), at
    READ COMMITTED (neither Django's ``isolation_level`` nor, as claims found out, the
    server's default above it), once migration 0006 installed
    ``django_idempotency_complete``. No query is sent (the function's presence is cached
    per process).
    """
    if connection.vendor != "postgresql" or stricter_than_read_committed(connection):
        return False  # Django's level or, as claims found out, the server's default
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding") is True:
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3) and has_completion_function(connection)


def complete(claim: Claim, response: StoredResponse, *, commit: bool = False) -> bool:
    """Mark the claim completed with ``response``, fenced by the owner token.

    Must run inside the atomic block that holds the view's business writes, so the
    effect and the record commit together. The body is written through
    :func:`encode_body`: dropped past ``MAX_RESPONSE_BYTES``, else encoded by
    ``BODY_CODEC``. On PostgreSQL the fenced ``UPDATE`` runs in the server-side function
    of migration 0006 when it is installed (planned once per session), else as a plain
    statement.

    Args:
        claim: the claim this request owns.
        response: what to store.
        commit: send the transaction's ``COMMIT`` in the same round trip (the caller
            checked :func:`commits_with_completion` and that the transaction is its
            outermost block, whose exit then finds nothing left to commit). A lost
            lease aborts the transaction before the ``COMMIT`` runs.

    Returns:
        Whether the transaction was committed here.

    Raises:
        LeaseLost: no row matched: the lease ran out and another request took the key
            over. Let it propagate out of the atomic block so everything rolls back.
        django.db.IntegrityError: with ``commit``, the ``COMMIT`` refused the view's
            writes (a deferred constraint); the record table has none of its own.
    """
    body = encode_body(response.body)
    if body is None:
        logger.warning(
            "response of %d bytes exceeds MAX_RESPONSE_BYTES; stored without its body, "
            "a replay answers 410",
            len(response.body),
            extra={"principal": claim.scope.principal, "endpoint": claim.scope.endpoint},
        )
    headers = [list(pair) for pair in response.headers]
    connection = connections[claim.using]
    if connection.vendor == "postgresql":
        params: dict[str, Any] = {
            "status": response.status,
            "headers": json.dumps(headers),
            "body": body,
            "id": claim.record_id,
            "token": claim.owner_token,
            "grace": claim.lease,
            "clock_offset": clock.offset(),
            # The partition key: one day partition planned and touched, not all.
            "sweep_after": claim.sweep_after,
        }
        unlock = claim.present and presence.holds(claim)  # the lock goes in the statement
        if unlock:
            params.update(_scope_filter(claim.scope))
        if commit or has_completion_function(connection):
            try:
                with _fenced_errors(claim), connection.cursor() as cursor:
                    cursor.execute(complete_call_sql(unlock=unlock, commit=commit), params)
            except LeaseLost as lost:
                if unlock and _sqlstate(lost.__cause__) == FENCED_SQLSTATE:
                    presence.dropped(claim)  # the function released the lock, then raised
                raise
            if unlock:
                presence.dropped(claim)
            return commit
        pruned = claim.sweep_after is not None
        if unlock:
            with _fenced_errors(claim), connection.cursor() as cursor:
                cursor.execute(
                    PG_COMPLETE_PRUNED_UNLOCK_SQL if pruned else PG_COMPLETE_UNLOCK_SQL, params
                )
                updated = cursor.fetchone()[0]
            presence.dropped(claim)
        else:
            with _fenced_errors(claim), connection.cursor() as cursor:
                cursor.execute(PG_COMPLETE_PRUNED_SQL if pruned else PG_COMPLETE_SQL, params)
                updated = cursor.rowcount
    else:
        now = _now_value(claim.using)
        updated = _fenced(claim).update(
            state=RecordState.COMPLETED,
            response_status=response.status,
            response_headers=headers,
            response_body=body,
            completed_at=now,
            lease_until=now,
            expires_at=Greatest(F("expires_at"), _now_value(claim.using, claim.lease)),
        )
    if updated != 1:
        raise LeaseLost(f"record {claim.record_id}: the lease was lost before completion")
    return False


def release(claim: Claim) -> bool:
    """Delete the claim if this request still owns it and no phase of it committed.

    Returns whether a row went. A record with a recovery point is never deleted: one
    of its phases committed (even if this request never heard the COMMIT succeed), so
    its lease runs out instead and a retry resumes after that phase.
    """
    # One fenced DELETE. ``.delete()`` would collect the rows first (outbox messages
    # point here with SET_NULL) and then delete by primary key alone, unfenced.
    connection = connections[claim.using]
    if claim.present and presence.holds(claim) and not connection.in_atomic_block:
        params: dict[str, Any] = {
            "id": claim.record_id,
            "token": claim.owner_token,
            **_scope_filter(claim.scope),
        }
        with connection.cursor() as cursor:  # the presence lock goes in the same statement
            cursor.execute(PG_RELEASE_UNLOCK_SQL, params)
            deleted = cursor.fetchone()[0]
        presence.dropped(claim)
        return bool(deleted)
    return bool(_fenced(claim).filter(recovery_point="")._raw_delete(claim.using))


def abandon(claim: Claim) -> None:
    """Give ``claim`` up before anything ran under it (a ``claimed`` receiver raised).

    Nothing was done, so the key is released (the record deleted) and a retry runs at
    once, on every backend; a taken-over claim whose earlier attempt finished a phase
    keeps its recovery point and its lease ends now instead (:func:`suspend`), so a
    retry resumes it. Its presence lock is released either way. A store failure here is
    logged, never raised: the caller re-raises what made it give up.
    """
    try:
        if claim.recovery_point:
            suspend(claim)
        else:
            release(claim)
    except (DatabaseError, InterfaceError) as exc:  # the lease runs out instead
        logger.error(
            "could not give up an idempotency claim: %s",
            exc,
            extra={"principal": claim.scope.principal, "endpoint": claim.scope.endpoint},
        )
    finally:
        presence.ensure_released(claim)


def advance(claim: Claim, recovery_point: str) -> None:
    """Record that phase ``recovery_point`` finished, fenced by the owner token (docs/phases.md).

    Must run inside the phase's atomic block, so the phase's writes and the new
    recovery point commit together.

    Raises:
        LeaseLost: another request took the key over; let it roll the phase back.
    """
    with _fenced_errors(claim):
        updated = _fenced(claim).update(recovery_point=recovery_point)
    if updated != 1:
        raise LeaseLost(f"record {claim.record_id}: the lease was lost before {recovery_point!r}")


def suspend(claim: Claim) -> bool:
    """End the lease now, keeping the claim and its recovery point (fenced).

    For a phased request that failed after a phase committed: its effects exist, so
    the key is not released; the client's retry takes the claim over at once and
    resumes after the recovery point. Returns whether the claim was still ours.
    """
    return bool(_fenced(claim).update(lease_until=_now_value(claim.using)))


def extend(claim: Claim, seconds: float) -> bool:
    """Heartbeat: make the lease end ``seconds`` from now, if the claim is still ours.

    Commits at once, even inside the view's atomic block: on PostgreSQL it then uses a
    second, short-lived connection, so other requests see the new lease without
    waiting for the view's transaction. (SQLite has one writer per database, so there
    the update joins the current transaction.)

    Returns:
        ``False`` when the claim was lost (taken over): the caller should stop.

    Raises:
        HeartbeatUnavailable: the database runs above READ COMMITTED (see there).
    """
    connection = connections[claim.using]
    if connection.vendor != "postgresql":
        until = _now_value(claim.using, seconds)
        return bool(
            _fenced(claim).update(lease_until=until, expires_at=Greatest(F("expires_at"), until))
        )
    params: dict[str, Any] = {
        "id": claim.record_id,
        "token": claim.owner_token,
        "seconds": seconds,
        "clock_offset": clock.offset(),
    }
    # A committed claim is extended from a second connection when the view's
    # transaction is open; an uncommitted one only exists in this connection.
    side = connection.in_atomic_block and claim.committed
    if side and stricter_than_read_committed(connection):
        raise HeartbeatUnavailable(
            f"extend_lease() cannot work on database {claim.using!r}: its isolation level "
            "is above READ COMMITTED, so a heartbeat committed beside this request's "
            "transaction would make the request's own completion fail. Give this view a "
            "lease longer than its longest run, or use READ COMMITTED for this database."
        )
    target = connection.copy() if side else connection
    try:
        with target.cursor() as cursor:
            cursor.execute(PG_EXTEND_SQL, params)
            return bool(cursor.rowcount == 1)
    finally:
        if target is not connection:
            target.close()
