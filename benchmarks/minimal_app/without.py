"""The app with one of its speed mechanisms turned off, for ``benchmarks/mechanisms.py``.

``BENCH_WITHOUT=<name>`` in the server's environment (read by the benchmark's WSGI
entry points, ``minimal_app/wsgi.py`` and ``leasebroker_wsgi.py``, once Django is set
up) replaces one piece of django_idempotency in this process by the plain way of doing
the same thing, so that an A/B run measures what the mechanism gains. Every variant
keeps the protocol's guarantees; only the statements sent, or how many round trips they
take, change. Nothing here is part of the package: it patches attributes of this
benchmark server's process only, and fails (``AttributeError``) when a name it patches
is gone, rather than patching nothing. ``tests/benchmarks/test_mechanism_switches.py``
checks that each variant turns its mechanism off.

Names (``MECHANISMS``):

* ``cached_table_facts``: the table kind and server port are read from the catalog
  before every claim (one query more per claim): the claim's ``is_partitioned`` forgets
  the cache first;
* ``nothing``: nothing changes: the control, whose A/B difference is the noise.

Each variant takes ``replace(target, name, value)``, which sets an attribute that must
exist: :func:`apply` sets it for the life of the process, a test passes
``monkeypatch.setattr``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``replace(target, name, value)``: set ``target.name``, which must exist.
Replace = Callable[[Any, str, Any], None]


def _replace(target: Any, name: str, value: Any) -> None:
    if not hasattr(target, name):
        raise AttributeError(
            f"{getattr(target, '__name__', target)!r} has no {name!r}: the mechanism moved, "
            "update benchmarks/minimal_app/without.py"
        )
    setattr(target, name, value)


def _cached_table_facts(replace: Replace) -> None:
    from django_idempotency.store import catalog
    from django_idempotency.store.records import postgresql

    original = postgresql.is_partitioned

    def is_partitioned(connection: Any) -> bool:
        catalog.forget()
        return original(connection)

    replace(postgresql, "is_partitioned", is_partitioned)  # where PostgresRecords.insert calls it


MECHANISMS: dict[str, Callable[[Replace], None]] = {
    "cached_table_facts": _cached_table_facts,
    "nothing": lambda replace: None,
}


def apply(name: str, *, replace: Replace = _replace) -> None:
    """Turn the mechanism ``name`` off in this process.

    Args:
        name: one of :data:`MECHANISMS`.
        replace: how an attribute is set (``monkeypatch.setattr`` in a test).

    Raises:
        ValueError: ``name`` is not one of :data:`MECHANISMS`.
        AttributeError: a name the variant patches no longer exists.
    """
    if name not in MECHANISMS:
        raise ValueError(f"BENCH_WITHOUT={name!r}: one of {', '.join(MECHANISMS)}")
    MECHANISMS[name](replace)
