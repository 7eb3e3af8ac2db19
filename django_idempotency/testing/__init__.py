"""Helpers for the tests of projects that use django-idempotency (docs/testing.md).

* :func:`travel`, :func:`past_lease`: move the idempotency clock (leases, retention)
  on every backend, with no sleeps.
* :func:`fire_duplicates`: send N identical requests with one key at the same moment,
  on separate threads and database connections; ``.assert_ran_once()`` on the result.
* :func:`fence_stale_owner`: an attempt that outlives its lease while a retry takes
  over; ``.assert_fenced()`` on the result.
* :class:`IdempotencyTestMixin`: the same for ``TransactionTestCase``; and, for
  pytest, the ``idempotency_kit`` fixture (``pytest_plugin``, loaded automatically).
"""

from __future__ import annotations

from django_idempotency.testing.clock import past_lease, travel
from django_idempotency.testing.duplicates import Duplicates, fire_duplicates
from django_idempotency.testing.fencing import Fencing, fence_stale_owner
from django_idempotency.testing.mixins import IdempotencyTestMixin

__all__ = [
    "Duplicates",
    "Fencing",
    "IdempotencyTestMixin",
    "fence_stale_owner",
    "fire_duplicates",
    "past_lease",
    "travel",
]
