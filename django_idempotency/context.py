"""``request.idempotency``: what a view can know and do about its claim."""

from __future__ import annotations

from . import store


class IdempotencyContext:
    """Attached to the request as ``request.idempotency`` while an idempotent view runs.

    Attributes:
        key: the client's idempotency key.
        principal: the principal the record is scoped to.
        endpoint: the endpoint the record is scoped to (``"POST /v1/workers"``).
        taken_over: ``True`` when an earlier attempt's expired lease was taken over.
        recovery_point: the last phase an earlier attempt finished (``""``: none).
    """

    def __init__(self, claim: store.Claim, *, lease: float) -> None:
        self._claim = claim
        self._lease = lease
        self.key = claim.scope.key
        self.principal = claim.scope.principal
        self.endpoint = claim.scope.endpoint
        self.taken_over = claim.taken_over
        self.recovery_point = claim.recovery_point

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
        return store.extend(self._claim, self._lease if seconds is None else seconds)
