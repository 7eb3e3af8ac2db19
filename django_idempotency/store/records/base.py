"""The claim's contract with a store kind (:class:`RecordStore`): facts, no judgement."""

from __future__ import annotations

import uuid

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.values import BY_PRESENCE, Claim, Existing, Scope


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
