"""Fire identical requests at a view at the same moment; assert that it ran once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django_idempotency.testing.outcomes import ClientFactory, describe, kind_of, send
from django_idempotency.testing.threads import (
    counting_claims,
    require_committed_reads,
    run_together,
)


@dataclass(frozen=True)
class Duplicates:
    """What a burst of identical requests got back.

    Attributes:
        key: the idempotency key every request carried.
        responses: the test client's responses, one per thread, in thread order.
        runs: how many times the view started for ``key`` during the burst (claims,
            takeovers included). 1 is the guarantee.
    """

    key: str
    responses: tuple[Any, ...]
    runs: int

    @property
    def statuses(self) -> list[int]:
        """The status codes, in thread order."""
        return [response.status_code for response in self.responses]

    def of_kind(self, kind: str) -> list[Any]:
        """The responses of one kind (see ``outcomes.kind_of``).

        Kinds: ``"original"`` (the view's own answer), ``"replay"``, ``"in-flight"``
        (409), ``"lease-lost"`` (409), ``"unavailable"`` (503) or ``"other"``.
        """
        return [response for response in self.responses if kind_of(response) == kind]

    def summary(self) -> str:
        """One line: ``view ran 1 time; answers: 201, 201 replay, 409 request-in-flight``."""
        answers = ", ".join(describe(response) for response in self.responses)
        return f"view ran {self.runs} time(s) for key {self.key!r}; answers: {answers}"

    def assert_ran_once(self, *, allow_unavailable: bool = False) -> Any:
        """Assert the guarantee: the view ran once, every other answer a 409 or a replay.

        A replay must repeat the original's status and body byte for byte. A 503
        ``store-unavailable`` (on SQLite: the write lock was not free within the busy
        timeout) is a failure unless ``allow_unavailable``.

        Returns:
            The original response (the one the view produced).

        Raises:
            AssertionError: with :meth:`summary` and what was wrong.
        """
        allowed = {"original", "replay", "in-flight"} | (
            {"unavailable"} if allow_unavailable else set()
        )
        originals = self.of_kind("original")
        problems = []
        if self.runs == 0:
            problems.append(
                "no request claimed the key (is the view idempotent, and did the requests "
                "reach it?)"
            )
        elif self.runs != 1:
            problems.append(f"the view ran {self.runs} times, not once")
        if len(originals) != 1:
            problems.append(f"{len(originals)} answers came from the view itself, not 1")
        unexpected = [describe(r) for r in self.responses if kind_of(r) not in allowed]
        if unexpected:
            problems.append(f"unexpected answers: {', '.join(unexpected)}")
            if any(kind_of(r) == "unavailable" for r in self.responses) and _in_memory_sqlite():
                problems.append(
                    "the test database is SQLite in memory, where concurrent writers fail "
                    "at once instead of waiting: give it a file name "
                    "(DATABASES['default']['TEST'] = {'NAME': ...}, docs/testing.md)"
                )
        if len(originals) == 1:
            first = originals[0]
            for replay in self.of_kind("replay"):
                if (replay.status_code, replay.content) != (first.status_code, first.content):
                    problems.append(f"a replay differs from the original: {describe(replay)}")
                    break
        if problems:
            raise AssertionError("; ".join(problems) + f" ({self.summary()})")
        return originals[0]


def _in_memory_sqlite() -> bool:
    """Whether the records' database is an in-memory SQLite database (the test default)."""
    from django.db import connections

    from django_idempotency.store.routing import record_database

    connection: Any = connections[record_database()]
    return connection.vendor == "sqlite" and bool(connection.is_in_memory_db())


def fire_duplicates(
    client_factory: ClientFactory,
    path: str,
    data: Any = None,
    *,
    method: str = "post",
    count: int = 8,
    key: str | None = None,
    timeout: float = 30.0,
    **extra: Any,
) -> Duplicates:
    """Send ``count`` identical requests with one key at the same moment, and collect them.

    Each request runs on its own thread with its own database connection and its own
    test client; a barrier releases them together. Use it in a ``TransactionTestCase``
    or a ``@pytest.mark.django_db(transaction=True)`` test: the threads must see what
    the others commit.

    Args:
        client_factory: returns a new test client (``APIClient``, Django's ``Client``),
            authenticated as the caller; called once per thread.
        path: the URL to send to (``"/orders"``).
        data: the body, passed to the client's method as is.
        method: ``"post"``, ``"put"``, ``"patch"`` or ``"delete"``.
        count: how many requests, at least 1.
        key: the ``Idempotency-Key`` (default: a new UUID).
        timeout: seconds each thread may take.
        **extra: passed to the client's method (``format="json"``, headers...).

    Returns:
        The :class:`Duplicates`; call ``assert_ran_once()`` on it.

    Raises:
        RuntimeError: called inside a transaction (a ``TestCase``).
        BaseException: what a request raised (Django's test client re-raises the
            view's exceptions unless ``raise_request_exception = False``).
    """
    require_committed_reads()
    key = key or str(uuid.uuid4())
    with counting_claims(key) as claims:
        responses = run_together(
            lambda _: send(client_factory, method, path, data, key, extra), count, timeout=timeout
        )
    return Duplicates(key=key, responses=tuple(responses), runs=claims.count)
