"""Which database holds a request's idempotency record (docs/deployment.md).

A completion is atomic with the view's writes only when both are on one database, so
the record lives where the view writes. In order of precedence:

1. the view's ``using=`` option: an alias, or ``callable(request) -> alias``;
2. the ``DATABASE_RESOLVER`` setting: ``callable(request) -> alias`` (or its dotted
   path), for projects that choose a tenant's shard per request;
3. the router: ``db_for_write(IdempotencyRecord)``, else ``"default"``.

Claims, lookups, replays and heartbeats always use the chosen alias, a write alias:
whatever a router does with reads, they never run on a replica.

The sweeper and the relay, which run outside any request, cover :func:`all_databases`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from django_idempotency.conf import conf, resolve_callable
from django_idempotency.models import IdempotencyRecord, OutboxMessage

DatabaseChoice = str | Callable[[Any], str]


def record_database() -> str:
    """The router's alias for writing idempotency records (``"default"`` without one)."""
    return router.db_for_write(IdempotencyRecord) or "default"


def outbox_database() -> str:
    """The router's alias for writing outbox messages (``"default"`` without one)."""
    return router.db_for_write(OutboxMessage) or "default"


def check_alias(alias: object, source: str) -> str:
    """``alias`` if it names a database in ``settings.DATABASES``.

    Args:
        alias: what ``source`` gave.
        source: who gave it, for the message (``"the view's using="``).

    Raises:
        ImproperlyConfigured: ``alias`` is not a string naming a configured database.
    """
    if not isinstance(alias, str) or alias not in connections.settings:
        raise ImproperlyConfigured(
            f"{source} gave {alias!r}, which is not a database alias in "
            f"settings.DATABASES ({', '.join(sorted(connections.settings))})."
        )
    return alias


def for_request(request: Any, using: DatabaseChoice | None) -> str:
    """The alias of the database that holds ``request``'s record.

    Args:
        request: the Django or DRF request (passed to a callable choice as is).
        using: the view's ``using=`` option: an alias, ``callable(request) -> alias``,
            a dotted path to such a callable, or ``None`` (the setting, then the router).

    Raises:
        ImproperlyConfigured: the choice is not a configured database alias.
        Exception: whatever a callable choice raised (a ``PermissionDenied`` or
            ``Http404`` for an unknown tenant is answered by Django as usual).
    """
    if using is None:
        resolver = conf.database_resolver
        if resolver is None:
            return record_database()
        return check_alias(resolver(request), "IDEMPOTENCY['DATABASE_RESOLVER']")
    if isinstance(using, str) and "." not in using:
        return check_alias(using, "the view's using=")
    choose = resolve_callable(using)
    if choose is None or not callable(choose):  # pragma: no cover - resolve_callable raises
        raise ImproperlyConfigured(f"the view's using= is not an alias or a callable: {using!r}")
    return check_alias(choose(request), f"the view's using= ({using!r})")


def all_databases() -> tuple[str, ...]:
    """The aliases the sweeper and the relay cover when no alias is given.

    The ``DATABASES`` setting (each checked), else the router's aliases for records
    and for outbox messages (one alias in a single-database project).

    Raises:
        ImproperlyConfigured: the setting names an alias that is not configured.
    """
    configured = conf.databases
    if configured is not None:
        return tuple(check_alias(alias, "IDEMPOTENCY['DATABASES']") for alias in configured)
    return tuple(dict.fromkeys((record_database(), outbox_database())))
