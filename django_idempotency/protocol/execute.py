"""A claimed request: run the view once and settle the claim (docs/protocol.md).

:func:`execute` runs the view in ``transaction.atomic()`` and, in the same
transaction, completes the record fenced by the owner token; a release status or an
exception rolls everything back and releases the key; a lost lease rolls back and
answers 409. Phased views (``phases=[...]``) hand over to ``phases.execute``.

What the view does to its own transaction is the view's outcome, answered as it would
be without the app: a transaction the view doomed (``set_rollback(True)``, a
PostgreSQL transaction aborted by a statement it caught) rolls back and its response
is returned unstored; an ``IntegrityError`` at ``COMMIT`` (a deferred constraint the
view's writes violate: the record table has none) is the view's exception. Only a
failure of the record's own statements (the completing ``UPDATE``, a connection lost
at ``COMMIT``) is a store failure, answered 503 (docs/robustness.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, IntegrityError, InterfaceError
from django.http.response import HttpResponseBase

from django_idempotency import exceptions, signals, store, transactions
from django_idempotency.conf import conf
from django_idempotency.logs import scope_fields
from django_idempotency.protocol import phases, problems
from django_idempotency.protocol.context import IdempotencyContext, UnprotectedContext
from django_idempotency.protocol.decisions import Proceed
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.release import release_claim
from django_idempotency.protocol.responses import rebuild_consumed, snapshot
from django_idempotency.store import heartbeat, presence
from django_idempotency.transactions import write_guard

logger = logging.getLogger("django_idempotency")


def attach(request: Any, context: IdempotencyContext | UnprotectedContext | None) -> None:
    """Set ``request.idempotency`` (on a DRF request, on its Django request too)."""
    request.idempotency = context
    http = getattr(request, "_request", None)
    if http is not None:
        http.idempotency = context


class _Release(Exception):
    def __init__(self, response: HttpResponseBase) -> None:
        super().__init__("release")
        self.response = response


def execute(
    proceed: Proceed,
    request: Any,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
) -> HttpResponseBase:
    """Run the view once for a claimed key and settle the claim (docs/protocol.md).

    Args:
        proceed: the claim from :func:`begin`.
        request: the request(s) ``request.idempotency`` is attached to.
        call: runs the view and returns its response.
        finalize: renders the response to bytes (DRF negotiation, templates).

    Returns:
        The view's response; a rebuilt copy if it was streaming; the view's response
        unstored (key released) if the view doomed its transaction; the 409
        lease-lost problem if the completion was fenced off (everything rolled back);
        the 503 store-unavailable problem if the store failed while completing.

    Raises:
        Whatever the view raised, after rolling back and releasing the key (a phased
        view that finished a phase keeps its claim instead: docs/phases.md); the
        ``IntegrityError`` of a deferred constraint the view's writes violated, raised
        at ``COMMIT``, the same way.
        exceptions.CrossDatabaseWrite: a single-transaction view wrote to a database
            other than its record's (the write was not sent; the key is released).
    """
    claim, options = proceed.claim, proceed.options
    context = IdempotencyContext(
        claim, lease=options.get_lease(), phases=options.phases, request=request
    )
    caller = getattr(request, "idempotency", None)  # a calling view's, on its request
    attach(request, context)
    lease, beat = options.get_lease(), None
    started = time.monotonic()
    try:
        with heartbeat.beating(claim, lease, options.get_heartbeat()) as beat:
            return _execute(context, options, call, finalize, proceed.view_name)
    finally:
        presence.ensure_released(claim)  # the settling statement normally did it
        if isinstance(caller, IdempotencyContext):  # the caller's own again
            attach(request, caller)
        renewed = beat is not None or context.lease_renewed
        executed(claim, time.monotonic() - started, lease, renewed)


def executed(claim: store.Claim, duration: float, lease: float, renewed: bool) -> None:
    """Send the ``executed`` signal of an execution that ran ``duration`` seconds.

    Args:
        claim: the execution's claim.
        duration: seconds from its start under the claim to its end.
        lease: seconds of the lease the claim was granted.
        renewed: the lease was extended while it ran (heartbeat or ``extend_lease``).
    """
    signals.executed.send(
        claim.scope.endpoint,
        duration=duration,
        lease=lease,
        renewed=renewed,
        near_lease=signals.execution_near_lease(duration, lease, renewed),
        **scope_fields(claim.scope),
    )


def _execute(
    context: IdempotencyContext,
    options: Options,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
    view_name: str,
) -> HttpResponseBase:
    claim = context.claim
    with context.activated():
        if options.phases:  # no single transaction: each phase commits on its own
            try:
                response, stored = phases.execute(context, options, call, finalize)
            except exceptions.LeaseLost:
                return _lease_lost(claim)
            except phases.CompletionFailed as exc:
                return _completion_failed(claim, exc.__cause__ or exc)
            if stored is not None:
                signals.completed.send(
                    claim.scope.endpoint, status=stored.status, **scope_fields(claim.scope)
                )
            return response
        return _execute_atomic(claim, options, call, finalize, view_name)


def _lease_lost(claim: store.Claim) -> HttpResponseBase:
    signals.fenced.send(claim.scope.endpoint, **scope_fields(claim.scope))
    return problems.problem_response(
        problems.LEASE_LOST,
        "This request's lease ended before it completed (it ran longer than its "
        "lease, or an operator ended the lease) and another attempt with the same key "
        "took over; its changes were rolled back. Retry with the same key to get the "
        "result of the attempt that completed.",
        retry_after=conf.retry_after,
    )


def _execute_atomic(
    claim: store.Claim,
    options: Options,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
    view_name: str,
) -> HttpResponseBase:
    """The view and its completion in one ``transaction.atomic()`` block.

    Writes to any other database are refused while the view runs (``write_guard``).
    """
    stage = "view"  # then "complete" (our UPDATE), then "commit" (the block's exit)
    try:
        with transactions.atomic(claim.using):
            with write_guard.guard(view_name, claim.scope.endpoint, claim.using) as guard:
                response = finalize(call())
                release = options.should_release(response.status_code)
                doomed = "" if release else transactions.doomed(claim.using)
                if not (release or doomed):  # a streaming body is consumed here, guarded
                    stored = snapshot(response, options.get_replay_headers())
                    if getattr(response, "streaming", False):
                        # Its generator ran just now, inside the transaction: a statement
                        # it caught without a savepoint dooms that transaction as the
                        # view's own statements would.
                        doomed = transactions.doomed(claim.using)
                        if doomed:
                            response = rebuild_consumed(response, stored)
            guard.check()  # a refused write the view caught still fails the request
            if release:
                raise _Release(response)
            if doomed:
                _log_doomed(claim, doomed, response.status_code)
                raise _Release(response)  # nothing of it can commit: nothing to store
            if getattr(response, "streaming", False):
                response = rebuild_consumed(response, stored)
            stage = "complete"
            store.complete(claim, stored)
            stage = "commit"
    except _Release as release:
        release_claim(claim, release.response.status_code)
        return release.response
    except exceptions.LeaseLost:
        return _lease_lost(claim)
    except (DatabaseError, InterfaceError) as exc:
        release_claim(claim, None)
        if stage == "view" or (stage == "commit" and isinstance(exc, IntegrityError)):
            raise  # the view's own database error, or its data refused at COMMIT: a 500
        return _completion_failed(claim, exc)
    except BaseException:
        release_claim(claim, None)
        raise
    signals.completed.send(claim.scope.endpoint, status=stored.status, **scope_fields(claim.scope))
    return response


def _log_doomed(claim: store.Claim, reason: str, status: int) -> None:
    """Log a view's response that cannot be stored because its transaction is doomed."""
    extra = {"principal": claim.scope.principal, "endpoint": claim.scope.endpoint}
    if reason == "rollback":  # deliberate: transaction.set_rollback(True)
        logger.info(
            "the view marked its transaction for rollback: its %d response is returned "
            "unstored and the key released",
            status,
            extra=extra,
        )
        return
    logger.warning(
        "the view caught a database error without a savepoint, which aborted its "
        "transaction: nothing was committed, its %d response is returned unstored and "
        "the key released. Wrap the statement that may fail in transaction.atomic().",
        status,
        extra=extra,
    )


def _completion_failed(claim: store.Claim, exc: BaseException) -> HttpResponseBase:
    """503 for a store failure while completing (the UPDATE or the COMMIT).

    Whatever happened, the record and the view's writes share one transaction: either
    both committed (the record is completed, the release above left it alone, a retry
    replays) or neither did (the claim was released, or its lease runs out; a retry
    runs the view). The client cannot tell which, so it is told to retry.
    """
    signals.store_failed.send(claim.scope.endpoint, error=exc, **scope_fields(claim.scope))
    return problems.problem_response(
        problems.STORE_UNAVAILABLE,
        "The idempotency store failed while saving the result of this request, so it "
        "may or may not have taken effect. Retry later with the same key: you will get "
        "its result, or it will run once.",
        retry_after=conf.retry_after,
    )
