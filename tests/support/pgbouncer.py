"""pytest plugin: the tests' connections go through PgBouncer (``-p tests.support.pgbouncer``).

With ``PGBOUNCER_PORT`` set (and ``DATABASE_URL`` on the PostgreSQL server itself), the
test databases are created, migrated and dropped on the server directly, and every
connection the tests open afterwards (threads, ``connection.copy()``, subprocesses
given :func:`database_url`) goes through the pooler on that port of the same host.
``CREATE DATABASE`` and ``DROP DATABASE`` need no session on the database, which a
pooler keeps open. Without ``PGBOUNCER_PORT`` the plugin does nothing.
Start the pooler with ``.ci/pgbouncer.sh start`` (docs/testing.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.db import connections


def pgbouncer_port() -> str | None:
    """The pooler's port when the suite runs through PgBouncer, else ``None``."""
    return os.environ.get("PGBOUNCER_PORT") or None


#: Through PgBouncer's transaction pooling the backend a session saw at connect time is
#: the pooler's, shared: terminating it does not kill this connection.
NOT_POOLED = pytest.mark.skipif(
    bool(pgbouncer_port()), reason="kills the server session: not through the pooler"
)


def database_url(alias: str = "default") -> str:
    """A URL of ``alias``'s test database, as the tests connect to it (pooler or not)."""
    settings = connections.settings[alias]
    port = settings.get("PORT") or 5432
    return f"postgres://{settings['USER']}@{settings['HOST']}:{port}/{settings['NAME']}"


@pytest.fixture(scope="session", autouse=True)
def _through_pgbouncer(request: pytest.FixtureRequest) -> Iterator[None]:
    port = pgbouncer_port()
    if port is None:
        yield
        return
    request.getfixturevalue("django_db_setup")
    blocker = request.getfixturevalue("django_db_blocker")
    aliases = [alias for alias in connections if connections[alias].vendor == "postgresql"]
    direct = {alias: connections.settings[alias].get("PORT") for alias in aliases}
    for alias in aliases:
        connections[alias].close()
        # What a project behind a transaction pooler sets (docs/deployment.md).
        connections.settings[alias]["PORT"] = port
        connections.settings[alias]["DISABLE_SERVER_SIDE_CURSORS"] = True
    yield
    for alias in aliases:
        connections[alias].close()
        connections.settings[alias]["PORT"] = direct[alias]
    names = [connections.settings[alias]["NAME"] for alias in aliases]
    with blocker.unblock(), connections["default"].cursor() as cursor:
        # The pooler's idle server sessions on the test databases would make DROP
        # DATABASE fail; it opens new ones when asked.
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            [names],
        )
    connections["default"].close()
