"""The claim's contract with a store kind (:class:`RecordStore`): facts, no judgement."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.exceptions import LeaseLost
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store.isolation import SERIALIZATION_FAILURE
from django_idempotency.store.rows import sqlstate_of
from django_idempotency.store.sql import FENCED_SQLSTATE
from django_idempotency.store.values import BY_PRESENCE, Claim, Existing, Headers, Scope


class RecordStore:
    """The claim's statements on one database (``using``: its alias).

    Each method is one statement (or one short transaction) and reports what the
    database holds; what a record means for a request is decided by
    ``store.claims.judge``, in one place. The conditional writes (:meth:`take_over`,
    :meth:`forget`) are re-checked by the database, so among concurrent contenders
    exactly one wins.
    """

    def __init__(self, using: str) -> None:
        self.using = using

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The calling thread's connection to the database."""
        return connections[self.using]

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
        """Insert a claim of ``scope`` owned by ``token``, or read the record that holds it.

        Args:
            scope: the record's identity.
            fingerprint: the request's stored fingerprint.
            token: the new owner token.
            lease: seconds of the new claim's lease.
            retention: seconds of its retention window (never shorter than the lease).
            request_path: the concrete path, kept with a new record.

        Returns:
            The :class:`Claim` of a new record; the :class:`Existing` record that holds
            the key; ``None`` when the answer is not known yet (the record went away
            between the insert and the read): ask again.

        Raises:
            django.db.DatabaseError: the database failed; nothing was claimed.
        """
        raise NotImplementedError

    def take_over(
        self, scope: Scope, record: Existing, token: uuid.UUID, *, lease: float, cause: str
    ) -> Claim | None:
        """Install ``token`` on ``scope``'s claimed ``record`` if it is unchanged since it was read.

        Taken over when its lease has run out, or, when ``cause`` is ``BY_PRESENCE``,
        when its owner's session is still found gone (``Existing.owner_gone``). The
        retention window is pushed to end no earlier than the new ``lease`` (seconds).

        Returns:
            The new owner's :class:`Claim`, with ``cause`` as its ``takeover_cause``;
            ``None`` when the record changed, or another contender won.

        Raises:
            django.db.DatabaseError: the database failed.
        """
        raise NotImplementedError

    def forget(self, record: Existing) -> None:
        """Delete ``record`` if it is unchanged since it was read and past its window.

        Never a record whose lease is live, so a contender's fresh claim is never
        deleted; the key is then claimed anew (a new row, a new id).

        Raises:
            django.db.DatabaseError: the database failed.
        """
        raise NotImplementedError

    def complete(self, claim: Claim, status: int, headers: Headers, body: bytes | None) -> None:
        """Mark ``claim`` completed with a response, if this request still owns it.

        Runs in the caller's transaction (the view's), so the record and the view's
        writes commit together; the lease ends and the retention window is pushed to
        end no earlier than a lease from now.

        Args:
            claim: the claim this request owns.
            status: the response's HTTP status code.
            headers: the stored headers, ``(name, value)`` pairs.
            body: the stored (encoded) body; ``None`` when it was too large to keep.

        Raises:
            LeaseLost: the claim is no longer this request's (taken over, or its lease
                ended by an operator).
        """
        raise NotImplementedError

    def release(self, claim: Claim) -> bool:
        """Delete ``claim`` if this request still owns it and no phase of it committed.

        One fenced ``DELETE`` of a record without a recovery point, on every store kind
        unless it has a cheaper one. (``.delete()`` would collect the rows first, as
        outbox messages point here with ``SET_NULL``, and then delete by primary key
        alone, unfenced.)

        Returns:
            Whether the record went.
        """
        return bool(fenced(claim).filter(recovery_point="")._raw_delete(self.using))

    def extend(self, claim: Claim, seconds: float) -> bool:
        """Make ``claim``'s lease end ``seconds`` from now, if it is still this request's.

        Committed at once where the store can (see ``store.settle.extend``); the
        retention window is pushed to end no earlier than the lease.

        Returns:
            ``False`` when the claim was lost.

        Raises:
            HeartbeatUnavailable: the heartbeat cannot commit beside the caller's
                transaction on this database.
        """
        raise NotImplementedError


def fenced(claim: Claim) -> Any:
    """The record of ``claim`` as a queryset, if this request still owns it (claimed, its token)."""
    return IdempotencyRecord.objects.using(claim.using).filter(
        pk=claim.record_id, owner_token=claim.owner_token, state=RecordState.CLAIMED
    )


@contextmanager
def fenced_errors(claim: Claim) -> Iterator[None]:
    """Turn a fenced write's failure into :class:`LeaseLost` where it means the claim was lost.

    At REPEATABLE READ or SERIALIZABLE, PostgreSQL refuses to update a row changed since
    the transaction's snapshot instead of re-checking the fence (SQLSTATE 40001): the
    record was taken over (or its lease ended by an operator) while the view ran. The
    completion function raises ``FENCED_SQLSTATE`` when its fence matches no row.
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


def taken_over(
    scope: Scope,
    record: Existing,
    token: uuid.UUID,
    using: str,
    *,
    lease: float,
    cause: str,
    present: bool = False,
) -> Claim:
    """The new owner's :class:`Claim` of ``record``, taken over for ``cause``.

    It resumes at the record's recovery point (docs/phases.md); ``present``: the new
    owner's session holds the presence lock (``store.presence``).
    """
    return Claim(
        scope,
        record.record_id,
        token,
        True,
        record.recovery_point,
        using,
        lease=lease,
        present=present,
        by_presence=cause == BY_PRESENCE,
        takeover_cause=cause,
    )
