"""``IdempotencyTestMixin``: the kit as ``TransactionTestCase`` methods."""

from __future__ import annotations

from typing import Any

from django_idempotency.testing.duplicates import Duplicates, fire_duplicates
from django_idempotency.testing.fencing import Fencing, fence_stale_owner
from django_idempotency.testing.outcomes import ClientFactory


class IdempotencyTestMixin:
    """The testing kit as test-case methods; mix into a ``TransactionTestCase``.

    Example::

        class OrderRaceTests(IdempotencyTestMixin, TransactionTestCase):
            def test_duplicates_run_once(self):
                burst = self.fire_duplicates(self.client_for_alice, "/orders", {...},
                                             format="json")
                self.assertRanOnce(burst)

    Django's ``TestCase`` cannot run these: its transaction hides each thread's
    claim from the others, and the helpers raise ``RuntimeError`` there.
    """

    failureException: type[BaseException] = AssertionError

    def fire_duplicates(
        self, client_factory: ClientFactory, path: str, data: Any = None, **options: Any
    ) -> Duplicates:
        """:func:`django_idempotency.testing.fire_duplicates`; same arguments."""
        return fire_duplicates(client_factory, path, data, **options)

    def fence_stale_owner(
        self, client_factory: ClientFactory, path: str, data: Any = None, **options: Any
    ) -> Fencing:
        """:func:`django_idempotency.testing.fence_stale_owner`; same arguments."""
        return fence_stale_owner(client_factory, path, data, **options)

    def assertRanOnce(self, duplicates: Duplicates, *, allow_unavailable: bool = False) -> Any:
        """Fail unless the view ran once and every other answer was a 409 or a replay.

        Returns:
            The original response.
        """
        try:
            return duplicates.assert_ran_once(allow_unavailable=allow_unavailable)
        except AssertionError as exc:
            raise self.failureException(str(exc)) from None

    def assertFenced(self, fencing: Fencing) -> Any:
        """Fail unless the stale owner got 409 ``lease-lost`` and the retry's answer won.

        Returns:
            The retry's response.
        """
        try:
            return fencing.assert_fenced()
        except AssertionError as exc:
            raise self.failureException(str(exc)) from None
