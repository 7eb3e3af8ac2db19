"""Atomic phases, recovery points and derived keys (docs/phases.md).

A view declared with ``@idempotent(phases=["allocated", "leased", "booted"])`` runs
outside one big transaction. Each ``with request.idempotency.phase(name):`` block is a
transaction that commits the phase's writes and the record's ``recovery_point``
together, fenced by the owner token. A retry after a crash takes the claim over and
resumes after the last finished phase; finished phases are never repeated. This is the
shape of brandur/rocket-rides-atomic (atomic phases, recovery points), see
docs/phases.md.

``keys.derive_key`` gives the stable sub-key a phase passes to a downstream system, so a
retry of a phase that did not commit converges on the same downstream ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, transaction
from django.http.response import HttpResponseBase

from django_idempotency import exceptions, store, transactions
from django_idempotency.exceptions import PhaseError
from django_idempotency.protocol.responses import rebuild_consumed, snapshot

if TYPE_CHECKING:
    from django_idempotency.protocol.context import IdempotencyContext
    from django_idempotency.protocol.options import Options


logger = logging.getLogger("django_idempotency")


class CompletionFailed(RuntimeError):
    """The store failed while completing a phased request (``__cause__``: the error).

    The claim was released or suspended; the caller answers 503 (docs/robustness.md).
    """


def position(phases: tuple[str, ...], name: str) -> int:
    """Index of ``name`` in the view's declared ``phases`` (``""``, no phase: -1).

    Raises:
        PhaseError: ``name`` is not one of the declared phases.
    """
    if not name:
        return -1
    try:
        return phases.index(name)
    except ValueError:
        raise PhaseError(
            f"{name!r} is not a phase of this view (declared: {list(phases)!r}). Phases "
            "of an endpoint must not be renamed or removed while requests may resume."
        ) from None


@contextmanager
def phase_block(context: IdempotencyContext, name: str) -> Iterator[None]:
    """The transaction of phase ``name``; see ``IdempotencyContext.phase``.

    A body that leaves its transaction unable to commit (``set_rollback(True)``, or on
    PostgreSQL a database error caught without a savepoint) rolls the phase back, as
    ``atomic()`` would: nothing of it commits, the recovery point stays, and the phase
    is still pending.

    Raises:
        PhaseError: the view declared no phases, ``name`` is unknown, already finished
            or not after the recovery point, or another phase is open.
        exceptions.LeaseLost: the claim was taken over; the phase rolled back.
    """
    phases = context.phases
    if not phases:
        raise PhaseError(
            "request.idempotency.phase() needs the phases declared on the view, e.g. "
            '@idempotent(phases=["allocated", "leased", "booted"]).'
        )
    if context.open_phase:
        raise PhaseError(f"phase {name!r} opened inside phase {context.open_phase!r}")
    if position(phases, name) <= position(phases, context.recovery_point):
        raise PhaseError(
            f"phase {name!r} already finished (recovery point {context.recovery_point!r}) "
            f"and must not run again: guard it with "
            f"`if request.idempotency.pending({name!r}):`."
        )

    using = context.claim.using
    doomed = ""
    context.open_phase = name
    try:
        with transactions.atomic(using, durable=True):
            yield
            doomed = transactions.doomed(using)
            if doomed:  # the view's choice: the phase rolls back, as an atomic() would
                transaction.set_rollback(True, using=using)
            else:
                store.advance(context.claim, name)
    finally:
        context.open_phase = ""
    if doomed:
        logger.warning(
            "phase %r rolled back by the view (%s): nothing of it committed and it is "
            "still pending",
            name,
            "transaction.set_rollback(True)"
            if doomed == "rollback"
            else "a database error caught without a savepoint",
            extra={"principal": context.principal, "endpoint": context.endpoint},
        )
        return
    context.recovery_point = name


def execute(
    context: IdempotencyContext,
    options: Options,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
    release: Callable[[store.Claim, int | None], None],
) -> tuple[HttpResponseBase, store.StoredResponse | None]:
    """Run a phased view for a claimed key and settle the claim (docs/phases.md).

    The view is not wrapped in a transaction: its phases commit one by one. Then:

    * a response to store: a fenced completion, in its own transaction;
    * an exception or a release status before any phase committed (recovery point
      still empty): ``release`` deletes the claim, as for an unphased view;
    * an exception or a release status after a phase committed: the claim stays,
      with its recovery point, and its lease ends now (fenced), so the client's retry
      takes it over at once and resumes after that phase.

    Args:
        context: ``request.idempotency`` of this request.
        options: the view's options.
        call: runs the view and returns its response.
        finalize: renders the response to bytes.
        release: deletes a claim (``protocol``'s release, with its signal).

    Returns:
        ``(response, stored)``: ``stored`` is ``None`` when nothing was stored.

    Raises:
        exceptions.LeaseLost: the claim was taken over (during a phase or the completion).
        CompletionFailed: the database failed while completing; the claim was released
            (no phase committed) or suspended (a retry resumes).
        Whatever the view raised, after the claim was released or suspended.
    """
    claim = context.claim
    try:
        response = finalize(call())
    except exceptions.LeaseLost:
        raise
    except BaseException:
        _unwind(context, None, release)
        raise
    if options.should_release(response.status_code):
        _unwind(context, response.status_code, release)
        return response, None
    stored = snapshot(response, options.get_replay_headers())
    if getattr(response, "streaming", False):
        response = rebuild_consumed(response, stored)
    try:
        with transaction.atomic(using=claim.using):  # no view code runs in it
            store.complete(claim, stored)
    except exceptions.LeaseLost:
        raise
    except (DatabaseError, InterfaceError) as exc:
        # Committed or not, the retry converges: a completed record is left alone by
        # the fenced release / suspend; otherwise the retry resumes after the phases.
        _unwind(context, None, release)
        raise CompletionFailed(str(exc)) from exc
    return response, stored


def _unwind(
    context: IdempotencyContext,
    status: int | None,
    release: Callable[[store.Claim, int | None], None],
) -> None:
    """Release the claim if no phase committed, else end its lease so a retry resumes."""
    if not context.recovery_point:
        release(context.claim, status)
        return

    extra = {"principal": context.principal, "endpoint": context.endpoint}
    try:
        kept = store.suspend(context.claim)
    except DatabaseError as exc:  # the lease runs out on its own; never mask the cause
        logger.error("could not end the lease of a phased claim: %s", exc, extra=extra)
        return
    if kept:
        logger.warning(
            "phased request failed after phase %r; lease ended so a retry resumes",
            context.recovery_point,
            extra=extra,
        )
