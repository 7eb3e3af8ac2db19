"""Atomic phases, recovery points and derived keys (docs/phases.md).

A view declared with ``@idempotent(phases=["allocated", "leased", "booted"])`` runs
outside one big transaction. Each ``with request.idempotency.phase(name):`` block is a
transaction that commits the phase's writes and the record's ``recovery_point``
together, fenced by the owner token. A retry after a crash takes the claim over and
resumes after the last finished phase; finished phases are never repeated. This is the
shape of brandur/rocket-rides-atomic (atomic phases, recovery points), see
docs/phases.md.

:func:`derive_key` gives the stable sub-key a phase passes to a downstream system, so a
retry of a phase that did not commit converges on the same downstream ids.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, transaction
from django.http.response import HttpResponseBase

from django_idempotency import exceptions
from django_idempotency.exceptions import PhaseError

if TYPE_CHECKING:
    from django_idempotency import store
    from django_idempotency.protocol.context import IdempotencyContext
    from django_idempotency.protocol.options import Options

# ``store`` and ``responses`` (models) are imported inside the functions that use them:
# ``derive_key`` and ``validate_phases`` are pure and importable before Django is set
# up (``options.py`` imports this module).

logger = logging.getLogger("django_idempotency")

#: Longest phase name: the width of ``IdempotencyRecord.recovery_point``.
MAX_PHASE_LENGTH = 64
#: Prefix of every derived key.
DERIVED_KEY_PREFIX = "idk_"
#: Domain-separation tag hashed before the inputs; bumping it changes every key.
_DERIVE_TAG = b"django-idempotency:derive-key:v1"


class CompletionFailed(RuntimeError):
    """The store failed while completing a phased request (``__cause__``: the error).

    The claim was released or suspended; the caller answers 503 (docs/robustness.md).
    """


def derive_key(principal: str, endpoint: str, key: str, name: str) -> str:
    """A stable sub-key for a downstream system, from the record's scope and ``name``.

    Format (stable across processes and releases): ``"idk_"`` followed by 32 lowercase
    hexadecimal characters (``[0-9a-f]``), 36 characters in all. The hex part is the
    first 128 bits of SHA-256 over the tag ``b"django-idempotency:derive-key:v1"`` and
    then, for each of ``principal``, ``endpoint``, ``key`` and ``name`` in this order,
    its UTF-8 length as a 4-byte big-endian integer followed by its UTF-8 bytes. The
    length framing keeps ``("ab", "c")`` and ``("a", "bc")`` apart. No secret is
    involved: the key is an identifier, not a credential.

    Args:
        principal: the record's principal (``request.idempotency.principal``).
        endpoint: the record's endpoint (``"POST /v1/workers"``).
        key: the client's idempotency key.
        name: what the sub-key is for (``"boot"``), chosen by the view.

    Returns:
        The derived key, e.g. ``"idk_3f0c..."`` (36 characters).
    """
    digest = hashlib.sha256(_DERIVE_TAG)
    for part in (principal, endpoint, key, name):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big"))
        digest.update(data)
    return DERIVED_KEY_PREFIX + digest.hexdigest()[:32]


def validate_phases(value: object) -> tuple[str, ...]:
    """Check a view's ``phases=`` option and return it as a tuple.

    Raises:
        TypeError: not a list of distinct, non-empty strings of at most 64 characters.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            "phases takes the list of phase names in order, e.g. "
            f'phases=["allocated", "leased", "booted"], not {value!r}'
        )
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_PHASE_LENGTH:
            raise TypeError(
                f"each phase name must be a string of 1 to {MAX_PHASE_LENGTH} characters, "
                f"not {name!r}"
            )
    if len(set(names)) != len(names):
        raise TypeError(f"phase names must be distinct: {list(names)!r}")
    return names


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
    from django_idempotency import store, transactions

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
    from django_idempotency import store
    from django_idempotency.protocol.responses import rebuild_consumed, snapshot

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
    from django_idempotency import store

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
