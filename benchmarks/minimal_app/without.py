"""The app with one of its speed mechanisms turned off, for ``benchmarks/mechanisms.py``.

``BENCH_WITHOUT=<name>`` in the server's environment (read by ``wsgi.py`` once Django
is set up) replaces one piece of django_idempotency in this process by the plain way of
doing the same thing, so that an A/B run measures what the mechanism gains. Every
variant keeps the protocol's guarantees; only the statements sent, or how many round
trips they take, change. Nothing here is part of the package: it patches module
attributes of this benchmark server's process only.

Names (``MECHANISMS``):

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

    def complete(claim: Any, response: Any) -> None:
        original(dataclasses.replace(claim, sweep_after=None), response)

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
