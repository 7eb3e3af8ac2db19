"""A claim announced, and a claim released.

A view (``decide``) and the inbox's ``once()`` blocks announce a claim they own the
same way (:func:`announce`: the ``claimed`` signal; a receiver that raises gives the
claim up). The single-transaction execution (``execute``), the phased one (``phases``)
and ``once()`` release a claim the same way (:func:`release_claim`): the record is
deleted (fenced by the owner token) and the ``released`` signal is sent; a store that
fails meanwhile is logged, and the lease runs out on its own.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, InterfaceError

from django_idempotency import signals, store
from django_idempotency.logs import scope_fields

logger = logging.getLogger("django_idempotency")


def announce(claim: store.Claim) -> None:
    """Send ``claimed`` for ``claim``, which this request now owns.

    Raises:
        Whatever a receiver raised, after the claim was given up (``store.abandon``):
        nothing ran under it, so a retry runs at once (or resumes a phased claim).
    """
    try:
        signals.claimed.send(
            claim.scope.endpoint,
            taken_over=claim.taken_over,
            presence=claim.by_presence,
            cause=claim.takeover_cause,
            **scope_fields(claim.scope),
        )
    except BaseException:  # a receiver failed: nothing will run under this claim
        store.abandon(claim)  # nothing ran: the key is free for a retry at once
        raise


def release_claim(claim: store.Claim, status: int | None) -> None:
    """Delete the claim's record and send ``released`` (``status``: the view's, if any).

    Args:
        claim: the claim to release; the delete is fenced by its owner token, so a
            claim another caller took over is left alone.
        status: the HTTP status of the view's response that is not stored, ``None``
            when no response was made (the view or block raised, or its transaction
            cannot commit).

    A ``DatabaseError`` or ``InterfaceError`` of the store is logged at ``ERROR`` on the
    ``django_idempotency`` logger with the scope's fields, and ``released`` is not sent;
    nothing is raised: the lease runs out on its own, and the error that led to the
    release is the one the caller reports.
    """
    kwargs = scope_fields(claim.scope)
    try:
        store.release(claim)
    except (DatabaseError, InterfaceError) as exc:  # the lease runs out; never mask the cause
        logger.error("could not release idempotency claim: %s", exc, extra=kwargs)
        return
    signals.released.send(claim.scope.endpoint, status=status, **kwargs)
