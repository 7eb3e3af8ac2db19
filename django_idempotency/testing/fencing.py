"""A stale owner: an attempt that outlived its lease is fenced off, with no sleeps."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_idempotency import signals
from django_idempotency.logs import key_hash
from django_idempotency.store import tenants
from django_idempotency.testing.clock import past_lease
from django_idempotency.testing.outcomes import ClientFactory, describe, kind_of, send
from django_idempotency.testing.threads import counting_claims, require_committed_reads


@dataclass(frozen=True)
class Fencing:
    """The three answers of :func:`fence_stale_owner`.

    Attributes:
        key: the idempotency key of the three requests.
        stale: the first attempt's answer: it claimed the key, was held until its
            lease ran out, then ran the view; expected 409 ``lease-lost``.
        retry: the answer of the retry that took the claim over and ran the view.
        replay: a third request's answer; expected the replay of ``retry``.
        runs: claims made for the key (2: the first attempt and the takeover).
    """

    key: str
    stale: Any
    retry: Any
    replay: Any
    runs: int

    def summary(self) -> str:
        """``stale: 409 lease-lost; retry: 201; replay: 201 replay``."""
        return (
            f"stale: {describe(self.stale)}; retry: {describe(self.retry)}; "
            f"replay: {describe(self.replay)}"
        )

    def assert_fenced(self) -> Any:
        """Assert that the stale owner lost and the retry's result is the one kept.

        Returns:
            The retry's response.

        Raises:
            AssertionError: the stale attempt was not answered 409 ``lease-lost``, the
                retry was not the view's own answer, or the third request did not get
                the retry's response replayed byte for byte.
        """
        problems = []
        if kind_of(self.stale) != "lease-lost":
            problems.append("the stale attempt was not fenced off (409 lease-lost)")
        if kind_of(self.retry) != "original":
            problems.append("the retry did not run the view")
        if kind_of(self.replay) != "replay" or (
            (self.replay.status_code, self.replay.content)
            != (self.retry.status_code, self.retry.content)
        ):
            problems.append("the third request did not get the retry's answer replayed")
        if problems:
            raise AssertionError("; ".join(problems) + f" ({self.summary()})")
        return self.retry


class _HoldFirstClaim:
    """``claimed`` receiver: holds the first claim of one key until ``release``."""

    def __init__(self, key: str, timeout: float) -> None:
        self._hash = key_hash(key)
        self._timeout = timeout
        self.held = threading.Event()
        self.release = threading.Event()
        #: Where the first request's connections ran (its tenant, on django-tenants).
        self.places: dict[str, tenants.Place] = {}

    def __call__(self, sender: Any, *, key_hash: str, **_: Any) -> None:
        if key_hash != self._hash or self.held.is_set():
            return
        self.places = tenants.places()  # sent in the request's thread
        self.held.set()
        self.release.wait(self._timeout)


def _lease_of(key: str, default: float | None, places: dict[str, tenants.Place]) -> float | None:
    """The claimed record's lease, seconds (``lease_until - created_at``).

    Read where the first request claimed it: in its tenant's schema on django-tenants,
    whatever schema the test's own connection is in.
    """
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.store.routing import record_database

    if default is not None:
        return default
    using = record_database()
    with tenants.placed(using, places.get(using)):
        record = (
            IdempotencyRecord.objects.using(using).filter(key=key).order_by("-created_at").first()
        )
    if record is None:
        return None
    seconds = (record.lease_until - record.created_at).total_seconds()
    return seconds if seconds > 0 else None


def fence_stale_owner(
    client_factory: ClientFactory,
    path: str,
    data: Any = None,
    *,
    method: str = "post",
    key: str | None = None,
    lease: float | None = None,
    timeout: float = 30.0,
    **extra: Any,
) -> Fencing:
    """Make a first attempt outlive its lease while a retry takes over; collect all three.

    1. The first request claims the key on its own thread and is held right after its
       claim, before the view runs.
    2. The idempotency clock moves past the lease (:func:`past_lease`, no sleep) and a
       retry with the same key takes the claim over, runs the view and completes.
    3. The first request is let go: its view runs, its completion finds another owner,
       so its writes are rolled back and it answers 409 ``lease-lost``.
    4. A third request gets the retry's answer replayed.

    Use it in a ``TransactionTestCase`` or a ``transaction=True`` pytest test. Assert
    on your own rows afterwards: the view's effect exists once.

    Args:
        client_factory: returns a new, authenticated test client; called per request.
        path: the URL.
        data: the body.
        method: ``"post"``, ``"put"``, ``"patch"`` or ``"delete"``.
        key: the ``Idempotency-Key`` (default: a new UUID).
        lease: the view's lease in seconds; default: read from the claimed record.
        timeout: seconds to wait for each step.
        **extra: passed to the client's method (``format="json"``...).

    Returns:
        The :class:`Fencing`; call ``assert_fenced()`` on it.

    Raises:
        RuntimeError: called inside a transaction (a ``TestCase``).
        AssertionError: the first request answered without claiming the key (its
            answer is in the message), or a step took longer than ``timeout``.
        BaseException: what a request raised (Django's test client re-raises the
            view's exceptions unless ``raise_request_exception = False``).
    """
    require_committed_reads()
    key = key or str(uuid.uuid4())
    hold = _HoldFirstClaim(key, timeout)
    stale: list[Any] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            stale.append(send(client_factory, method, path, data, key, extra))
        except BaseException as exc:  # raised again in the test's thread
            errors.append(exc)
        finally:
            hold.held.set()  # never leave the test waiting for a claim that failed
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=first, daemon=True)
    signals.claimed.connect(hold, weak=False)
    try:
        with counting_claims(key) as claims:
            thread.start()
            if not hold.held.wait(timeout):
                raise AssertionError(f"the first request did not claim its key in {timeout} s")
            if errors:
                raise errors[0]
            if stale:
                raise AssertionError(f"the first request never claimed: {describe(stale[0])}")
            with past_lease(_lease_of(key, lease, hold.places)):
                retry = send(client_factory, method, path, data, key, extra)
            hold.release.set()
            thread.join(timeout)
            if errors:
                raise errors[0]
            if thread.is_alive() or not stale:
                raise AssertionError(f"the first request did not finish within {timeout} s")
            replay = send(client_factory, method, path, data, key, extra)
    finally:
        hold.release.set()
        signals.claimed.disconnect(hold)
    return Fencing(key=key, stale=stale[0], retry=retry, replay=replay, runs=claims.count)
