"""Whether a database holds this version's server-side functions (check W014).

The store calls its PostgreSQL functions by name: a database whose functions were
installed by another version of the package (or edited by hand) would run that
version's claim or completion. :func:`stale_functions` compares the body PostgreSQL
stores for each function the record table needs (``pg_proc.prosrc``) with the body in
this version's code.
"""

from __future__ import annotations

import re

from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.schema.functions import (
    CLAIM_FUNCTION,
    COMPLETE_FUNCTION,
    SCOPE_TRIGGER_FUNCTION,
)
from django_idempotency.store.sql import TABLE

_DEFINITION = re.compile(r"CREATE OR REPLACE FUNCTION (\w+)\(.*?\$fn\$(.*)\$fn\$", re.DOTALL)


def code_bodies(*definitions: str) -> dict[str, str]:
    """The body of each ``CREATE OR REPLACE FUNCTION`` statement, by function name."""
    bodies = {}
    for sql in definitions:
        match = _DEFINITION.search(sql)
        if match is None:
            raise ValueError(f"not a function definition quoted with $fn$: {sql[:60]!r}")
        bodies[match[1]] = match[2]
    return bodies


#: The table's facts and the bodies of the package's functions, in the schema in use.
_INSTALLED_SQL = """
SELECT (SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)),
       array(SELECT p.proname || chr(31) || p.prosrc FROM pg_proc p
             WHERE p.pronamespace = (SELECT oid FROM pg_namespace
                                     WHERE nspname = current_schema())
               AND p.proname LIKE 'django!_idempotency!_%%' ESCAPE '!')
"""


def stale_functions(connection: BaseDatabaseWrapper) -> list[str]:
    """Functions the record table on ``connection`` needs that are missing or not this version's.

    Looks in the connection's current schema (a django-tenants tenant's, when one is
    set). Nothing is needed, so nothing is reported, on other databases than
    PostgreSQL and where the record table does not exist (not migrated yet).

    Args:
        connection: a database connection.

    Returns:
        The names, sorted: ``django_idempotency_complete`` on any record table, and
        ``django_idempotency_claim`` and ``django_idempotency_record_scope_unique`` on
        the day-partitioned one.

    Raises:
        django.db.DatabaseError: the catalog could not be read.
    """
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_INSTALLED_SQL, [TABLE])
        kind, rows = cursor.fetchone()
    if kind is None:
        return []
    needed = [COMPLETE_FUNCTION]
    if kind == "p":
        needed += [CLAIM_FUNCTION, SCOPE_TRIGGER_FUNCTION]
    installed: dict[str, set[str]] = {}
    for row in rows:
        name, body = row.split(chr(31), 1)
        installed.setdefault(name, set()).add(body)  # overloads: any one of them
    return sorted(
        name for name, body in code_bodies(*needed).items() if body not in installed.get(name, ())
    )
