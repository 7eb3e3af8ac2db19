"""System checks on where records live (E009, W007, W008, W012, W013; docs/checks.md).

What can be seen before the first request: a database choice that names no configured
database, a router that keeps records apart from the project's other models (views
writing those models would have their writes refused), records kept where the
sweeper and the relay do not look, and, on PostgreSQL's day-partitioned record table,
days ahead running short or records waiting in the default partition (the sweeper has
not run for days).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router

from django_idempotency.checks.urls import protected_endpoints
from django_idempotency.conf import conf
from django_idempotency.store.reports import DEFAULT_ROWS_BOUND, partition_stats
from django_idempotency.store.routing import all_databases, record_database
from django_idempotency.store.schema.tables import days_needed

_DOCS = "docs/deployment.md, 'Several databases'"


def _static_usings() -> Iterator[tuple[str, object]]:
    """(view name, ``using=`` value) of every idempotent view that sets one."""
    seen: set[tuple[int, str]] = set()
    for obj, options, _kind in protected_endpoints():
        using = options.get("using") if isinstance(options, dict) else options.using
        if using is None or (id(obj), repr(using)) in seen:
            continue
        seen.add((id(obj), repr(using)))
        yield f"{obj.__module__}.{getattr(obj, '__qualname__', obj)}", using


@register(Tags.database)
def check_database_aliases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E009: the ``DATABASES`` setting names an alias that ``settings.DATABASES`` lacks."""
    try:
        all_databases()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="List only aliases of settings.DATABASES in IDEMPOTENCY['DATABASES'].",
                id="django_idempotency.E009",
            )
        ]
    return []


@register(Tags.urls)
def check_view_databases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E009 / W008: a view's ``using=`` names an unknown alias, or one nobody sweeps."""
    messages: list[CheckMessage] = []
    try:
        covered = set(all_databases())
    except ImproperlyConfigured:
        return []  # reported by check_database_aliases
    for view, using in _static_usings():
        if not isinstance(using, str) or "." in using:
            continue  # a per-request choice: see check_record_placement's W008
        if using not in connections.settings:
            messages.append(
                Error(
                    f"{view} keeps its idempotency records in database {using!r}, which "
                    "is not an alias of settings.DATABASES.",
                    hint="Give using= an alias of settings.DATABASES.",
                    id="django_idempotency.E009",
                )
            )
        elif using not in covered:
            messages.append(_uncovered(f"{view} keeps its records in {using!r}", covered))
    return messages


def _uncovered(what: str, covered: set[str]) -> Warning:
    return Warning(
        f"{what}, but the sweeper and the relay only cover "
        f"{', '.join(repr(a) for a in sorted(covered))} when given no database: its "
        "records would never be forgotten and its outbox messages never delivered.",
        hint=f"List every database that holds records in IDEMPOTENCY['DATABASES'] ({_DOCS}).",
        id="django_idempotency.W008",
    )


@register(Tags.database)
def check_record_placement(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W007: the router writes records to another database than the project's models.

    A view writing those models would have its record elsewhere: its writes are refused
    at run time (the completion could not commit with them). W008: a
    ``DATABASE_RESOLVER`` without the ``DATABASES`` setting.
    """
    messages: list[CheckMessage] = []
    if conf.database_resolver is not None and conf.databases is None:
        messages.append(
            _uncovered(
                "IDEMPOTENCY['DATABASE_RESOLVER'] chooses a database per request",
                {record_database()},
            )
        )
    records = record_database()
    elsewhere: dict[str, list[tuple[bool, str]]] = {}
    for model in apps.get_models():
        meta = model._meta
        if meta.app_label == "django_idempotency" or not meta.managed or meta.proxy:
            continue
        alias = router.db_for_write(model) or "default"
        if alias != records:
            # The project's own models first, Django's (auth, sessions, ...) after.
            elsewhere.setdefault(alias, []).append(
                (model.__module__.startswith("django."), meta.label)
            )
    for alias, models in sorted(elsewhere.items()):
        labels = [label for _, label in sorted(models)]
        shown = ", ".join(labels[:5]) + (" ..." if len(labels) > 5 else "")
        messages.append(
            Warning(
                f"The router writes idempotency records to {records!r} but {len(labels)} "
                f"model(s) to {alias!r} ({shown}). An idempotent view whose record is in "
                f"{records!r} cannot commit its writes to {alias!r} with its completion: "
                "such writes are refused while the view runs.",
                hint=f"Give views that write to {alias!r} using={alias!r}, or route "
                f"IdempotencyRecord and OutboxMessage with those models ({_DOCS}). If no "
                "idempotent view writes them, add 'django_idempotency.W007' to "
                "SILENCED_SYSTEM_CHECKS.",
                id="django_idempotency.W007",
            )
        )
    return messages


_RETENTION_DOCS = "docs/retention.md, 'Days ahead and the default partition'"


@register(Tags.database)
def check_record_partitions(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """W012 / W013: the days ahead run short, or records wait in the default partition.

    Only for the databases the check is asked about (``check --database``,
    ``migrate``) that hold a day-partitioned record table. W012: fewer days after
    today have a partition than the window of a claim made tomorrow needs (the
    sweeper has not run for ``PARTITIONS_AHEAD`` days): claims of the later days land in
    the default partition. W013: records wait in the default partition. A database
    that cannot be read (not migrated yet) is skipped.
    """
    messages: list[CheckMessage] = []
    try:
        covered = set(all_databases())
    except ImproperlyConfigured:
        return []  # reported by check_database_aliases
    needed = days_needed() + 1
    for alias in databases or ():
        if alias not in covered:
            continue
        try:
            stats = partition_stats(alias)
        except DatabaseError:
            continue
        if stats is None:
            continue
        if stats.days_ahead < needed:
            messages.append(
                Warning(
                    f"Only {stats.days_ahead} day(s) after today have a partition of the "
                    f"record table in {alias!r}; claims whose window ends later (up to "
                    f"{needed} days ahead) land in the default partition.",
                    hint="Run the sweeper (manage.py idempotency_sweep, or the "
                    "django_idempotency.sweep task), and schedule it at least daily: it "
                    f"creates the days ahead ({_RETENTION_DOCS}).",
                    id="django_idempotency.W012",
                )
            )
        if stats.default_rows:
            count = (
                f"at least {DEFAULT_ROWS_BOUND}"
                if stats.default_rows >= DEFAULT_ROWS_BOUND
                else str(stats.default_rows)
            )
            messages.append(
                Warning(
                    f"{count} record(s) wait in the default partition of the record table "
                    f"in {alias!r}: they were claimed while their day had no partition.",
                    hint="Run the sweeper: it moves them into their days, or deletes them "
                    f"once their window is over ({_RETENTION_DOCS}).",
                    id="django_idempotency.W013",
                )
            )
    return messages
