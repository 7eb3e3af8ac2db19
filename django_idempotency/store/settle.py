"""Settling a claim: complete, release, advance, suspend, extend (docs/concepts.md).

* :func:`complete`: inside the caller's atomic block, an UPDATE fenced by the owner
  token. Zero rows means the lease was lost: ``LeaseLost`` is raised so the caller's
  block, business writes included, rolls back.
* :func:`release`: delete a claim we own (failure before any effect); :func:`abandon`:
  give up a claim that never ran.
* :func:`advance`: a phase finished (recovery point), fenced; :func:`suspend`: end the
  lease of a phased claim that failed after a phase, so a retry resumes it.
* :func:`extend`: heartbeat, pushing ``lease_until`` forward; commits at once.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    connections,
)
from django.db.models import F
from django.db.models.functions import Greatest

from django_idempotency.exceptions import HeartbeatUnavailable, LeaseLost
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock, presence, tenants
from django_idempotency.store.isolation import SERIALIZATION_FAILURE, stricter_than_read_committed
from django_idempotency.store.rows import now_value, scope_filter, sqlstate_of
from django_idempotency.store.sql import (
    FENCED_SQLSTATE,
    PG_EXTEND_SQL,
    PG_RELEASE_UNLOCK_SQL,
    complete_bound_sql,
    complete_call_sql,
)
from django_idempotency.store.values import Claim, StoredResponse, encode_body

logger = logging.getLogger("django_idempotency")

#: Stored bodies from this many bytes on are sent to PostgreSQL as a binary parameter,
#: bound on the server, instead of in the query's text: Django's default client-side
#: binding escapes a body into hexadecimal text inside the query, which holds about
#: 4.5 times the body in memory at once; bound, the body is sent as it is (about 1 time;
#: docs/benchmarks.md, "Memory per request").
BOUND_BODY_BYTES = 64 * 1024


def _fenced(claim: Claim) -> Any:
    return IdempotencyRecord.objects.using(claim.using).filter(
        pk=claim.record_id, owner_token=claim.owner_token, state=RecordState.CLAIMED
    )


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
        sqlstate = sqlstate_of(exc)
        if sqlstate == SERIALIZATION_FAILURE:
            raise LeaseLost(
                f"record {claim.record_id}: changed by another request while this one ran"
            ) from exc
        if sqlstate == FENCED_SQLSTATE:
            raise LeaseLost(
                f"record {claim.record_id}: the lease was lost before completion"
            ) from exc
        raise


def _binds(connection: Any) -> bool:
    """Whether a completion on ``connection`` can bind its body on the server (psycopg 3)."""
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


def complete(claim: Claim, response: StoredResponse) -> None:
    """Mark the claim completed with ``response``, fenced by the owner token.

    Must run inside the atomic block that holds the view's business writes, so the
    effect and the record commit together: the block's exit commits both. The body is
    written through :func:`encode_body`: dropped past ``MAX_RESPONSE_BYTES``, else
    encoded by ``BODY_CODEC``. On PostgreSQL the fenced ``UPDATE`` runs in the
    server-side function ``django_idempotency_complete`` (planned once per session),
    which raises when it matches no row; elsewhere the ``UPDATE``'s row count is
    checked.

    Args:
        claim: the claim this request owns.
        response: what to store.

    Raises:
        LeaseLost: no row matched: the lease ran out and another request took the key
            over. Let it propagate out of the atomic block so everything rolls back.
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
    if connection.vendor != "postgresql":
        now = now_value(claim.using)
        updated = _fenced(claim).update(
            state=RecordState.COMPLETED,
            response_status=response.status,
            response_headers=headers,
            response_body=body,
            completed_at=now,
            lease_until=now,
            expires_at=Greatest(F("expires_at"), now_value(claim.using, claim.lease)),
        )
        if updated != 1:
            raise LeaseLost(f"record {claim.record_id}: the lease was lost before completion")
        return
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
        params.update(scope_filter(claim.scope))
    bound = body is not None and len(body) >= BOUND_BODY_BYTES and _binds(connection)
    try:
        with _fenced_errors(claim):
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
            **scope_filter(claim.scope),
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
    return bool(_fenced(claim).update(lease_until=now_value(claim.using)))


def extend(claim: Claim, seconds: float) -> bool:
    """Heartbeat: make the lease end ``seconds`` from now, if the claim is still ours.

    Commits at once, even inside the view's atomic block: on PostgreSQL it then uses a
    second, short-lived connection, so other requests see the new lease without
    waiting for the view's transaction; on a schema-per-tenant database it runs in the
    request's schema. (SQLite has one writer per database, so there
    the update joins the current transaction.)

    Returns:
        ``False`` when the claim was lost (taken over): the caller should stop.

    Raises:
        HeartbeatUnavailable: the database runs above READ COMMITTED (see there).
    """
    connection = connections[claim.using]
    if connection.vendor != "postgresql":
        until = now_value(claim.using, seconds)
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
    target = tenants.copy_of(connection) if side else connection  # in the request's schema
    try:
        with target.cursor() as cursor:
            cursor.execute(PG_EXTEND_SQL, params)
            return bool(cursor.rowcount == 1)
    finally:
        if target is not connection:
            target.close()
