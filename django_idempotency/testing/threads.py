"""Run callables on threads released together, one database connection each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

from django_idempotency import signals
from django_idempotency.logs import key_hash
from django_idempotency.store import tenants

T = TypeVar("T")


def require_committed_reads(using: str = DEFAULT_DB_ALIAS) -> None:
    """Raise if the caller runs inside a transaction that other threads cannot see.

    Raises:
        RuntimeError: the database connection of this thread is in an ``atomic()``
            block, as in Django's ``TestCase`` or a pytest-django ``db`` test.
    """
    if connections[using].in_atomic_block:
        raise RuntimeError(
            "Concurrent requests need data other connections can see, but this test runs "
            "inside a transaction (django.test.TestCase, or pytest-django's db fixture). "
            "Use TransactionTestCase, or @pytest.mark.django_db(transaction=True)."
        )


def run_together(func: Callable[[int], T], count: int, *, timeout: float = 30.0) -> list[T]:
    """Call ``func(0)`` ... ``func(count - 1)`` on ``count`` threads at the same moment.

    The threads wait on one barrier and are released together; each closes its own
    database connections when it ends (Django opens one per thread). On a
    schema-per-tenant database (django-tenants) each thread's connections start in the
    schema the caller's run in, not in ``public``.

    Args:
        func: called with the thread's index.
        count: how many threads, at least 1.
        timeout: seconds to wait for the barrier and then for each thread.

    Returns:
        The results, in index order.

    Raises:
        BaseException: the first exception a thread raised, once all have ended.
        AssertionError: a thread did not end within ``timeout``.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count!r}")
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    where = tenants.places()  # a tenant the caller runs in (django-tenants), per database

    def target(index: int) -> None:
        try:
            for alias, place in where.items():
                tenants.enter(alias, place)
            barrier.wait(timeout)
            results[index] = func(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise AssertionError(f"a request thread did not finish within {timeout} s")
    if errors:
        raise errors[0]
    return results


class ClaimCounter:
    """Counts the claims made for one key: how many times a view started for it."""

    def __init__(self, key: str) -> None:
        self._hash = key_hash(key)
        self._lock = threading.Lock()
        self.count = 0
        self.takeovers = 0

    def __call__(self, sender: Any, *, key_hash: str, taken_over: bool = False, **_: Any) -> None:
        """Receive one ``claimed`` signal."""
        if key_hash != self._hash:
            return
        with self._lock:
            self.count += 1
            self.takeovers += bool(taken_over)


@contextmanager
def counting_claims(key: str) -> Iterator[ClaimCounter]:
    """Count, inside the block, the claims of ``key`` (the ``claimed`` signal)."""
    counter = ClaimCounter(key)
    signals.claimed.connect(counter, weak=False)
    try:
        yield counter
    finally:
        signals.claimed.disconnect(counter)
