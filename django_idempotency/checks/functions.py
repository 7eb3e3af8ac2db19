"""System check W014: the records' databases hold this version's functions (docs/checks.md).

On PostgreSQL the claim and the completion run as server-side functions the migration
installs. A database migrated by another version of the package, or whose functions
were edited by hand, would run that version's protocol: the check compares them with
this version's code. It reads each database, so it carries the ``database`` tag: it runs
with ``manage.py check --database <alias>`` and before ``migrate``. A warning, not an
error: ``migrate``, which installs the functions, runs the database checks first and
would stop on an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Tags, Warning, register
from django.db import DatabaseError, connections

from django_idempotency.store.routing import all_databases
from django_idempotency.store.schema.installed import stale_functions


@register(Tags.database)
def check_installed_functions(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """W014: a database that holds records has missing or other versions' functions.

    Only the aliases Django asks to check (``databases``, from ``--database``) that
    hold records are read.
    """
    messages: list[CheckMessage] = []
    for alias in sorted(set(databases or ()) & set(all_databases())):
        try:
            stale = stale_functions(connections[alias])
        except DatabaseError:
            continue  # unreachable or not migrated: migrate reports that itself
        if stale:
            messages.append(
                Warning(
                    f"The {alias!r} database holds idempotency records, but its "
                    f"function(s) {', '.join(stale)} are missing or are not this "
                    "version's: the store would run another version's claim or "
                    "completion.",
                    hint="Run `python manage.py migrate django_idempotency` with this "
                    "version installed (docs/checks.md#django_idempotencyw014).",
                    id="django_idempotency.W014",
                )
            )
    return messages
