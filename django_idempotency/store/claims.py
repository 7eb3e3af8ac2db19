"""The claim: a request takes an idempotency key, or learns what holds it.

:func:`claim` asks the store to insert a claim against the uniqueness of (principal,
endpoint, key); when a record holds the key the store reports its facts, and
:func:`judge`, the one place that does, decides what they mean for the request: a
replay, a 422, a 409, a takeover (its lease ran out, or its owner's session is gone),
or the key's reuse (its record is past its retention window). A takeover and a reuse
are one conditional statement each, re-checked by the database
(``store.records``): among concurrent contenders exactly one wins. Never
SELECT-then-INSERT.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid

from django.db import connections

from django_idempotency.models import RecordState
from django_idempotency.store.fingerprints import same_request
from django_idempotency.store.isolation import own_transaction
from django_idempotency.store.records import record_store
from django_idempotency.store.routing import record_database
from django_idempotency.store.values import (
    BY_LEASE,
    BY_OPERATOR,
    BY_PRESENCE,
    Claim,
    Existing,
    Scope,
)

#: Attempts at "claim, or settle on the record we collided with" before answering 409.
_MAX_ROUNDS = 5


class Verdict(enum.Enum):
    """What a record that holds a key means for a request with that key (:func:`judge`)."""

    #: Completed for this request: replay its response (or the 410 of one too large).
    REPLAY = "replay"
    #: Used for another request (another fingerprint): 422 ``key-reused``.
    MISMATCH = "mismatch"
    #: Claimed with a live lease by a present owner: 409 ``request-in-flight`` (or wait).
    IN_FLIGHT = "in-flight"
    #: Claimed for this request, its lease over or its owner gone: take it over.
    TAKE_OVER = "take-over"
    #: Past its retention window (and its lease): the key is new again.
    REUSE = "reuse"


def judge(record: Existing, fingerprint: str) -> Verdict:
    """What ``record`` means for a request whose fingerprint is ``fingerprint``.

    The rules, in order (docs/protocol.md, docs/robustness.md):

    1. a record past its retention window whose lease is not live (completed, or its
       lease over) is forgotten: the key is new (:data:`Verdict.REUSE`);
    2. another request's record answers 422 (:data:`Verdict.MISMATCH`), as the IETF
       draft (draft-ietf-httpapi-idempotency-key-header, section 2.7) and Stripe do;
       "another request" is ``fingerprints.same_request``'s rule;
    3. a completed record is replayed (:data:`Verdict.REPLAY`);
    4. a claim whose lease ran out, or whose owner's session is gone
       (``record.owner_gone``), is taken over (:data:`Verdict.TAKE_OVER`, for
       :func:`cause`);
    5. anything else is in flight (:data:`Verdict.IN_FLIGHT`).

    Args:
        record: the record's facts as the store read them, by the store's clock.
        fingerprint: the request's stored fingerprint (or an inbox payload's).
    """
    live = not record.completed and record.lease_remaining > 0
    if record.expired and not live:
        return Verdict.REUSE
    if not same_request(record.fingerprint, fingerprint):
        return Verdict.MISMATCH
    if record.completed:
        return Verdict.REPLAY
    if not live or record.owner_gone:
        return Verdict.TAKE_OVER
    return Verdict.IN_FLIGHT


def cause(record: Existing) -> str:
    """Why a record judged :data:`Verdict.TAKE_OVER` is taken over (``Claim.takeover_cause``).

    :data:`BY_PRESENCE` while its lease is live (its owner is gone), else
    :data:`BY_OPERATOR` when an operator ended the lease, else :data:`BY_LEASE`.
    """
    if record.lease_remaining > 0:
        return BY_PRESENCE
    return BY_OPERATOR if record.ended_by_operator else BY_LEASE


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
        its retention window reused, or a claim of the same request taken over.
        Otherwise the :class:`Existing` record that stands, which :func:`judge` finds
        a replay, a mismatch or in flight.

    Raises:
        django.db.DatabaseError: the database failed; nothing was claimed.
    """
    using = using or record_database()
    records = record_store(using)
    token = uuid.uuid4()
    for _round in range(_MAX_ROUNDS):
        found = records.insert(
            scope, fingerprint, token, lease=lease, retention=retention, request_path=request_path
        )
        if found is None:  # the record went away between the insert and the read
            continue
        if isinstance(found, Claim):
            return _in_caller_transaction(found)
        verdict = judge(found, fingerprint)
        if verdict is Verdict.REUSE:
            records.forget(found)
        elif verdict is Verdict.TAKE_OVER:
            won = records.take_over(scope, found, token, lease=lease, cause=cause(found))
            if won is not None:
                return _in_caller_transaction(won)
        else:
            return found
    # Raced on every round (claims released or taken over under us): in flight.
    return Existing(0, RecordState.CLAIMED, fingerprint, 1.0, False, None)


def _in_caller_transaction(won: Claim) -> Claim:
    """``won``, marked not yet committed when made inside a transaction we did not open.

    (``TestCase``, ``ATOMIC_REQUESTS`` without the exemption, manual transactions:
    the claim is not committed until that transaction is.)
    """
    if own_transaction(connections[won.using]):
        return won
    return dataclasses.replace(won, committed=False)
