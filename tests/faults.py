"""Fault injection for the database-fault and security tests: a second connection to
kill backends with, a router sending records to another alias, aliases made at run time."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections


def admin_connection() -> psycopg.Connection[Any]:
    """A second, non-Django connection to the test database (autocommit)."""
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=int(s["PORT"] or 5432),
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    )


def terminate(pid: int) -> None:
    with admin_connection() as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()
    assert row == (True,)


def wait_for(condition: Callable[[], Any], timeout: float = 30) -> Any:
    """Poll an observable condition (a database state), not a clock, until it holds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        pause.wait(0.005)
    raise AssertionError("condition never held")


class RouteTo:
    """Database router: idempotency records (and, optionally, test-app rows) to ``alias``."""

    def __init__(self, alias: str, *, apps: tuple[str, ...] = ("django_idempotency",)) -> None:
        self.alias, self.apps = alias, apps

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label in self.apps else None

    db_for_read = db_for_write


@pytest.fixture
def extra_alias() -> Iterator[Callable[..., str]]:
    """A second connection to the test database, made at run time (this thread only):
    ``extra_alias(**overrides) -> alias``, overrides applied to its settings."""
    added: list[str] = []

    def add(**overrides: Any) -> str:
        alias = f"extra_{uuid.uuid4().hex[:8]}"
        default = connections["default"]
        connections[alias] = type(default)({**default.settings_dict, **overrides}, alias)
        added.append(alias)
        return alias

    yield add
    for alias in added:
        connections[alias].close()
        del connections[alias]


def unreachable(on_postgres: bool) -> dict[str, Any]:
    """Settings overrides for an alias whose database cannot be reached."""
    if on_postgres:
        return {"HOST": "127.0.0.1", "PORT": "1", "OPTIONS": {"connect_timeout": 5}}
    return {"NAME": "/nonexistent-dir/idempotency.sqlite3"}
