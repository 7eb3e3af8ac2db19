"""The app with one of its speed mechanisms turned off, for ``benchmarks/mechanisms.py``.

``BENCH_WITHOUT=<name>`` in the server's environment (read by ``wsgi.py`` once Django
is set up) replaces one piece of django_idempotency in this process by the plain way of
doing the same thing, so that an A/B run measures what the mechanism gains. Every
variant keeps the protocol's guarantees; only the statements sent, or how many round
trips they take, change. Nothing here is part of the package: it patches module
attributes of this benchmark server's process only.

Names (``MECHANISMS``):

* ``held_releases``: the view's ``RELEASE SAVEPOINT`` statements go out when Django
  makes them (``transactions/savepoints.py`` holds none);
* ``begin_with_savepoint``: the view's first ``SAVEPOINT`` goes alone, after psycopg's
  own ``BEGIN`` (``transactions/savepoints.py`` sends it as Django makes it);
* ``commit_with_completion``: the completion, then Django's ``COMMIT`` in a round trip
  of its own (``store.commits_with_completion`` answers no);
* ``async_claim_commit``: the claim's ``COMMIT`` waits for the WAL flush
  (``synchronous_commit`` left on);
* ``pruned_completion``: the completion is not given the partition key, so it plans
  and scans every day partition;
* ``cached_table_facts``: the table kind and server port are read from the catalog
  before every claim (one query more per claim);
* ``nothing``: nothing changes: the control, whose A/B difference is the noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def _held_releases() -> None:
    from django_idempotency.transactions import savepoints

    def holds(self: Any, name: str) -> bool:
        return False

    savepoints.ViewSavepoints._holds = holds  # type: ignore[method-assign]


def _begin_with_savepoint() -> None:
    from django_idempotency.transactions import savepoints

    def opens_transaction(self: Any) -> bool:
        return False

    savepoints.ViewSavepoints._opens_transaction = opens_transaction  # type: ignore[method-assign]


def _commit_with_completion() -> None:
    from django_idempotency import store
    from django_idempotency.store import settle

    def never(connection: Any) -> bool:
        return False

    settle.commits_with_completion = never  # type: ignore[assignment]
    store.commits_with_completion = never  # type: ignore[attr-defined]


def _async_claim_commit() -> None:
    from django_idempotency.store import claims

    original = claims.pg_params

    def pg_params(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "async_commit": False})

    claims.pg_params = pg_params  # type: ignore[assignment]


def _pruned_completion() -> None:
    from django_idempotency import store
    from django_idempotency.store import settle

    original = settle.complete

    def complete(claim: Any, response: Any, *, commit: bool = False) -> bool:
        return original(dataclasses.replace(claim, sweep_after=None), response, commit=commit)

    settle.complete = complete  # type: ignore[assignment]
    store.complete = complete  # type: ignore[attr-defined]


def _cached_table_facts() -> None:
    from django_idempotency.store import catalog, claims

    original = claims.is_partitioned

    def is_partitioned(connection: Any) -> bool:
        catalog.forget()
        return original(connection)

    claims.is_partitioned = is_partitioned  # type: ignore[assignment]


MECHANISMS: dict[str, Callable[[], None]] = {
    "held_releases": _held_releases,
    "begin_with_savepoint": _begin_with_savepoint,
    "commit_with_completion": _commit_with_completion,
    "async_claim_commit": _async_claim_commit,
    "pruned_completion": _pruned_completion,
    "cached_table_facts": _cached_table_facts,
    "nothing": lambda: None,
}


def apply(name: str) -> None:
    """Turn the mechanism ``name`` off in this process.

    Raises:
        ValueError: ``name`` is not one of :data:`MECHANISMS`.
    """
    if name not in MECHANISMS:
        raise ValueError(f"BENCH_WITHOUT={name!r}: one of {', '.join(MECHANISMS)}")
    MECHANISMS[name]()
