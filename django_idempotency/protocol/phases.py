"""A phased view: run it for a claimed key and settle the claim (docs/phases.md).

A view declared with ``@idempotent(phases=["allocated", "leased", "booted"])`` runs
outside one big transaction. Each ``with request.idempotency.phase(name):`` block
(``IdempotencyContext.phase``) is a transaction that commits the phase's writes and the
record's ``recovery_point`` together, fenced by the owner token. :func:`execute` runs
the view and settles the claim: a fenced completion, or, when the view fails, a release
(no phase committed) or the end of the lease, so that a retry takes the claim over and
resumes after the last finished phase; finished phases are never repeated. This is the
shape of brandur/rocket-rides-atomic (atomic phases, recovery points), see
docs/phases.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, transaction
from django.http.response import HttpResponseBase

from django_idempotency import exceptions, store
from django_idempotency.protocol.context import IdempotencyContext
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.release import release_claim
from django_idempotency.protocol.responses import rebuild_consumed, snapshot

logger = logging.getLogger("django_idempotency")


class CompletionFailed(RuntimeError):
    """The store failed while completing a phased request (``__cause__``: the error).

    The claim was released or suspended; the caller answers 503 (docs/robustness.md).
    """


def execute(
    context: IdempotencyContext,
    options: Options,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
) -> tuple[HttpResponseBase, store.StoredResponse | None]:
    """Run a phased view for a claimed key and settle the claim (docs/phases.md).

    The view is not wrapped in a transaction: its phases commit one by one. Then:

    * a response to store: a fenced completion, in its own transaction;
    * an exception or a release status before any phase committed (recovery point
      still empty): the claim is released, as for an unphased view;
    * an exception or a release status after a phase committed: the claim stays,
      with its recovery point, and its lease ends now (fenced), so the client's retry
      takes it over at once and resumes after that phase.

    Args:
        context: ``request.idempotency`` of this request.
        options: the view's options.
        call: runs the view and returns its response.
        finalize: renders the response to bytes.

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
        _unwind(context, None)
        raise
    if options.should_release(response.status_code):
        _unwind(context, response.status_code)
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
        _unwind(context, None)
        raise CompletionFailed(str(exc)) from exc
    return response, stored


def _unwind(context: IdempotencyContext, status: int | None) -> None:
    """Release the claim if no phase committed, else end its lease so a retry resumes."""
    if not context.recovery_point:
        release_claim(context.claim, status)
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
