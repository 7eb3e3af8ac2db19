"""``request.idempotency``: what a view can know and do about its claim.

Its phases (docs/phases.md) are its own: ``phase(name)`` opens the transaction of a
phase and moves the recovery point when it commits.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import transaction

from django_idempotency import store, transactions
from django_idempotency.exceptions import PhaseError
from django_idempotency.protocol import keys
from django_idempotency.store.routing import record_database

logger = logging.getLogger("django_idempotency")

_current: ContextVar[IdempotencyContext | None] = ContextVar(
    "django_idempotency_context", default=None
)


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


def current() -> IdempotencyContext | None:
    """The context of the idempotent view running now (this thread or task), if any."""
    return _current.get()


def running(scope: store.Scope, using: str, request: Any = None) -> IdempotencyContext | None:
    """The running execution (view or ``inbox.once`` block) a new call is part of.

    A call made by the running execution's code with the scope that execution claimed
    (the same principal, endpoint and key, on the same database) is part of it
    (docs/faq.md): a view called with the running view's request, or with a request
    the code built itself, or a ``once()`` block. A request that Django's URL resolver
    routed while the execution runs (an in-process client's, e.g. the test client
    called from a view) is a request of its own, never part of it.

    Args:
        scope: the scope the call is about to claim.
        using: the database alias of its record.
        request: the call's request (a Django ``HttpRequest`` or a DRF ``Request``),
            ``None`` for a ``once()`` block.

    Returns:
        The context of the running execution of this thread or task, or of one it was
        called from, that the call is part of; ``None`` when there is none.
    """
    context = _current.get()
    if context is None:
        return None
    http = getattr(request, "_request", request)
    while context is not None:
        claim = context.claim
        if claim.scope == scope and claim.using == using:
            if http is None or http is context._request:
                return context
            return None if getattr(http, "resolver_match", None) is not None else context
        context = context._caller
    return None


class IdempotencyContext:
    """Attached to the request as ``request.idempotency`` while an idempotent view runs.

    Attributes:
        key: the client's idempotency key.
        principal: the principal the record is scoped to.
        endpoint: the endpoint the record is scoped to (``"POST /v1/workers"``).
        taken_over: ``True`` when an earlier attempt's claim was taken over.
        takeover_cause: why it could be: ``"presence"`` (the earlier attempt's database
            session ended while its lease was live), ``"lease"`` (its lease expired) or
            ``"operator"`` (an operator ended its lease); ``""`` when not taken over.
        recovery_point: the last phase finished, by an earlier attempt or by this one
            (``""``: none). Updated as this request's phases commit.
        phases: the phases the view declared, in order (``()``: not a phased view).
        open_phase: the phase whose transaction is open now (``""``: none).
    """

    def __init__(
        self,
        claim: store.Claim,
        *,
        lease: float,
        phases: tuple[str, ...] = (),
        request: Any = None,
    ) -> None:
        self._claim = claim
        #: The Django request the claim was made for (``None`` for a ``once()`` block).
        self._request = getattr(request, "_request", request)
        self._lease = lease
        self.key = claim.scope.key
        self.principal = claim.scope.principal
        self.endpoint = claim.scope.endpoint
        self.taken_over = claim.taken_over
        self.takeover_cause = claim.takeover_cause
        self.recovery_point = claim.recovery_point
        self.phases = phases
        self.open_phase = ""
        self._outbox_counts: dict[tuple[str, str], int] = {}
        #: Whether :meth:`extend_lease` extended the lease (the ``executed`` signal).
        self.lease_renewed = False
        #: The running execution this one was called from, while it is active.
        self._caller: IdempotencyContext | None = None

    @property
    def claim(self) -> store.Claim:
        """The store's claim (record id, owner token, database alias)."""
        return self._claim

    def extend_lease(self, seconds: float | None = None) -> bool:
        """Heartbeat for long handlers: the lease now ends ``seconds`` from now.

        Call it before the lease runs out (default: the view's lease again). It
        commits at once, even inside the view's transaction.

        Returns:
            ``False`` if the claim was already taken over: stop and raise, the
            completion would be fenced off anyway.
        """
        kept = store.extend(self._claim, self._lease if seconds is None else seconds)
        self.lease_renewed = self.lease_renewed or kept
        return kept

    def derive_key(self, name: str) -> str:
        """A stable sub-key for a downstream system: same key, same ``name``, same result.

        Pass it as the idempotency key / request id of a downstream call so a retry
        converges on the same downstream object. Format: ``keys.derive_key``
        (``"idk_"`` + 32 lowercase hex characters).
        """
        return keys.derive_key(self.principal, self.endpoint, self.key, name)

    def done(self, name: str) -> bool:
        """Whether phase ``name`` already finished (at or before the recovery point).

        Raises:
            exceptions.PhaseError: ``name`` is not a declared phase of the view.
        """
        here = position(self.phases, self.recovery_point)
        return position(self.phases, name) <= here

    def pending(self, name: str) -> bool:
        """Whether phase ``name`` still has to run: ``not done(name)``."""
        return not self.done(name)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The transaction of phase ``name`` of a view declared with ``phases=[...]``.

        The block's writes and the new recovery point commit together, fenced by the
        owner token. Python cannot skip a ``with`` body, so guard each phase::

            if request.idempotency.pending("allocated"):
                with request.idempotency.phase("allocated"):
                    ...

        A body that leaves its transaction unable to commit (``set_rollback(True)``, or
        on PostgreSQL a database error caught without a savepoint) rolls the phase back,
        as ``atomic()`` would: nothing of it commits, the recovery point stays, and the
        phase is still pending.

        Raises:
            exceptions.PhaseError: the view declared no phases, or the phase is unknown,
                already finished (the guard is missing), before the recovery point, or
                nested in another phase.
            exceptions.LeaseLost: the claim was taken over; the phase rolled back.
        """
        phases = self.phases
        if not phases:
            raise PhaseError(
                "request.idempotency.phase() needs the phases declared on the view, e.g. "
                '@idempotent(phases=["allocated", "leased", "booted"]).'
            )
        if self.open_phase:
            raise PhaseError(f"phase {name!r} opened inside phase {self.open_phase!r}")
        if position(phases, name) <= position(phases, self.recovery_point):
            raise PhaseError(
                f"phase {name!r} already finished (recovery point {self.recovery_point!r}) "
                f"and must not run again: guard it with "
                f"`if request.idempotency.pending({name!r}):`."
            )

        using = self._claim.using
        doomed = ""
        self.open_phase = name
        try:
            with transactions.atomic(using, durable=True):
                yield
                doomed = transactions.doomed(using)
                if doomed:  # the view's choice: the phase rolls back, as an atomic() would
                    transaction.set_rollback(True, using=using)
                else:
                    store.advance(self._claim, name)
        finally:
            self.open_phase = ""
        if doomed:
            logger.warning(
                "phase %r rolled back by the view (%s): nothing of it committed and it is "
                "still pending",
                name,
                "transaction.set_rollback(True)"
                if doomed == "rollback"
                else "a database error caught without a savepoint",
                extra={"principal": self.principal, "endpoint": self.endpoint},
            )
            return
        self.recovery_point = name

    def next_outbox_key(self, topic: str) -> str:
        """The default dedup key of the next message enqueued on ``topic`` (docs/outbox.md).

        ``derive_key('["outbox", <record id>, "<owner token>", "<phase>", "<topic>",
        <n>]')``: the record id (the key's generation: a key reused after its retention
        window gets a new record, so new messages), the owner token (the attempt: a
        takeover's messages never collide with those of the stalled attempt it took
        over, so its insert never waits on that attempt's open transaction; at most one
        attempt's messages commit, since the fence rolls the other back), ``<phase>``
        the open phase (or empty) and ``n`` counting this request's messages on that
        topic in that phase from 0.
        """
        slot = (self.open_phase, topic)
        n = self._outbox_counts.get(slot, 0)
        self._outbox_counts[slot] = n + 1
        # A JSON list keeps the parts apart (a ":" in a phase or topic cannot make two
        # names equal); the record id is the key's generation: after the retention
        # window the key is new, its record is a new row, and so are its messages.
        claim = self._claim
        name = json.dumps(
            ["outbox", claim.record_id, str(claim.owner_token), self.open_phase, topic, n]
        )
        return self.derive_key(name)

    @contextmanager
    def activated(self) -> Iterator[IdempotencyContext]:
        """Make this the :func:`current` context inside the block."""
        self._caller = _current.get()
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)
            self._caller = None


class UnprotectedContext:
    """``request.idempotency`` of a phased view that runs without a key (key optional).

    Nothing is recorded and nothing protects the request, exactly as without the app;
    the same view code still runs: every phase is pending and runs in its own
    transaction, and derived keys are random for this request.
    """

    key = None
    principal = None
    endpoint = None
    taken_over = False
    recovery_point = ""

    def __init__(self, phases: tuple[str, ...], using: str | None = None) -> None:
        self.phases = phases
        self.using = using
        self.open_phase = ""
        self._derived: dict[str, str] = {}

    def pending(self, name: str) -> bool:
        """Always ``True``: no earlier attempt can have finished a phase."""
        return True

    def done(self, name: str) -> bool:
        """Always ``False``."""
        return False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block in its own transaction, like a phase, recording nothing."""
        self.open_phase = name
        try:
            with transaction.atomic(using=self.using or record_database()):
                yield
        finally:
            self.open_phase = ""

    def derive_key(self, name: str) -> str:
        """A random key per ``name``, stable within this request only."""
        return self._derived.setdefault(name, f"idk_{uuid.uuid4().hex}")

    def extend_lease(self, seconds: float | None = None) -> bool:
        """Nothing to extend; ``True``."""
        return True
