"""Fault injection for the database-fault and security tests: a second connection to
kill backends with, a router sending records to another alias, aliases made at run time."""

from __future__ import annotations

import contextlib
import socket
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


class Proxy:
    """A TCP forwarder on 127.0.0.1 to the test database's server, to cut and restore.

    ``cut()`` closes the listening socket and every connection through it (the server
    seems gone: connections drop, new ones are refused), ``restore()`` listens again on
    the same port. For processes that must ride out an outage of the database without
    disturbing the real server, which other tests share.
    """

    def __init__(self) -> None:
        s = connection.settings_dict
        self.target = (s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432))
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self.restore()

    def restore(self) -> None:
        """Listen (again) on the proxy's port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and drop every connection through the proxy."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        for sock in [listener, *sockets]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _address = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def direct_presence() -> None:
    """Skip unless the suite's connection takes owner-presence locks (PostgreSQL, direct)."""
    from django_idempotency.store import presence

    if not presence.takes(connections["default"]):
        pytest.skip("needs a direct PostgreSQL connection (owner presence)")


def committed_elsewhere(sql: str, *params: Any) -> Any:
    """A value read by a connection of its own: only what committed."""
    with admin_connection() as other:
        row = other.execute(sql, params).fetchone()
        return row[0] if row else None
