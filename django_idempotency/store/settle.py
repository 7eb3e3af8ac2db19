"""Settling a claim: complete, release, advance, suspend, extend (docs/concepts.md).

* :func:`complete`: inside the caller's atomic block, a write fenced by the owner
  token. No row matched means the lease was lost: ``LeaseLost`` is raised so the
  caller's block, business writes included, rolls back.
* :func:`release`: delete a claim we own (failure before any effect); :func:`abandon`:
  give up a claim that never ran.
* :func:`advance`: a phase finished (recovery point), fenced; :func:`suspend`: end the
  lease of a phased claim that failed after a phase, so a retry resumes it.
* :func:`extend`: heartbeat, pushing ``lease_until`` forward; commits at once.

The statements that differ by store kind (the completion, the release, the heartbeat)
are the record store's (``store.records``); the rest is the same ORM on every database.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, InterfaceError

from django_idempotency.exceptions import LeaseLost
from django_idempotency.store import presence
from django_idempotency.store.records import record_store
from django_idempotency.store.records.base import fenced, fenced_errors
from django_idempotency.store.rows import now_value
from django_idempotency.store.values import Claim, StoredResponse, encode_body

logger = logging.getLogger("django_idempotency")


def complete(claim: Claim, response: StoredResponse) -> None:
    """Mark the claim completed with ``response``, fenced by the owner token.

    Must run inside the atomic block that holds the view's business writes, so the
    effect and the record commit together: the block's exit commits both. The body is
    written through :func:`encode_body`: dropped past ``MAX_RESPONSE_BYTES``, else
    encoded by ``BODY_CODEC``.

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
    record_store(claim.using).complete(claim, response.status, response.headers, body)


def release(claim: Claim) -> bool:
    """Delete the claim if this request still owns it and no phase of it committed.

    Returns whether a row went. A record with a recovery point is never deleted: one
    of its phases committed (even if this request never heard the COMMIT succeed), so
    its lease runs out instead and a retry resumes after that phase.
    """
    return record_store(claim.using).release(claim)


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
    with fenced_errors(claim):
        updated = fenced(claim).update(recovery_point=recovery_point)
    if updated != 1:
        raise LeaseLost(f"record {claim.record_id}: the lease was lost before {recovery_point!r}")


def suspend(claim: Claim) -> bool:
    """End the lease now, keeping the claim and its recovery point (fenced).

    For a phased request that failed after a phase committed: its effects exist, so
    the key is not released; the client's retry takes the claim over at once and
    resumes after the recovery point. Returns whether the claim was still ours.
    """
    return bool(fenced(claim).update(lease_until=now_value(claim.using)))


def extend(claim: Claim, seconds: float) -> bool:
    """Heartbeat: make the lease end ``seconds`` from now, if the claim is still ours.

    Commits at once, even inside the view's atomic block: on PostgreSQL it then uses a
    second, short-lived connection, so other requests see the new lease without
    waiting for the view's transaction; on a schema-per-tenant database it runs in the
    request's schema. (SQLite has one writer per database, so there
    the update joins the current transaction.)

    Args:
        claim: the claim this request owns.
        seconds: the new lease, from now.

    Returns:
        ``False`` when the claim was lost (taken over): the caller should stop.

    Raises:
        HeartbeatUnavailable: the database runs above READ COMMITTED (see there).
    """
    return record_store(claim.using).extend(claim, seconds)
