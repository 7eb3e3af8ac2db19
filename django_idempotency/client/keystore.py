"""Where a client keeps its idempotency keys, so a restarted process reuses them.

A *logical operation* ("create the worker for order 42") gets one key, minted before
its first attempt and sent on every retry. If the process dies between two attempts,
the retry must still carry the same key, or the server cannot tell it from a new
request. A key store maps an operation name, chosen by the caller, to its key:

* :class:`MemoryKeyStore`: a dict; keys live as long as the process (the default).
* :class:`SQLiteKeyStore`: a small SQLite file; keys survive a restart and are
  shared by every thread and process that opens the same file.

Standard library only: no Django, no HTTP client. Used by ``django_idempotency.client``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["KeyStore", "MemoryKeyStore", "SQLiteKeyStore", "new_key"]


def new_key() -> str:
    """A fresh idempotency key: a random UUID (36 characters), as Stripe recommends."""
    return str(uuid.uuid4())


@runtime_checkable
class KeyStore(Protocol):
    """What ``IdempotentClient`` needs from a key store."""

    def key_for(self, operation: str) -> str:
        """The key of ``operation``, minted and saved on first use (atomic)."""
        ...

    def forget(self, operation: str) -> None:
        """Drop ``operation``'s key; the next :meth:`key_for` mints a new one."""
        ...


class MemoryKeyStore:
    """Keys in a dict, for one process. Thread-safe.

    Args:
        mint: makes a new key (default :func:`new_key`).
    """

    def __init__(self, *, mint: Callable[[], str] = new_key) -> None:
        self._mint = mint
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()

    def key_for(self, operation: str) -> str:
        """The key of ``operation``; the first caller mints it, every later one reads it."""
        with self._lock:
            key = self._keys.get(operation)
            if key is None:
                key = self._keys[operation] = self._mint()
            return key

    def forget(self, operation: str) -> None:
        """Drop ``operation``'s key (no error if there is none)."""
        with self._lock:
            self._keys.pop(operation, None)

    def __len__(self) -> int:
        return len(self._keys)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    operation TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""


class SQLiteKeyStore:
    """Keys in a SQLite file: they survive a restart and are shared between processes.

    :meth:`key_for` is one ``INSERT ... ON CONFLICT DO NOTHING`` followed by a read,
    committed before it returns, so two threads or processes asking for the same
    operation at once get the same key, and a process killed after it returned finds
    the key again when it restarts. Every call opens its own short-lived connection,
    so one store object may be shared by many threads.

    Args:
        path: the database file; created (with its table) if missing.
        mint: makes a new key (default :func:`new_key`).
        timeout: seconds to wait for another writer's lock before
            ``sqlite3.OperationalError`` is raised.
    """

    def __init__(
        self, path: str | Path, *, mint: Callable[[], str] = new_key, timeout: float = 10.0
    ) -> None:
        self.path = Path(path)
        self._mint = mint
        self._timeout = timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute(_SCHEMA)

    def _connect(self) -> closing[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        return closing(conn)

    def key_for(self, operation: str) -> str:
        """The key of ``operation``, minted and committed on first use.

        Raises:
            sqlite3.Error: the file cannot be written (permissions, disk full, lock
                held longer than ``timeout``).
        """
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO idempotency_keys (operation, key, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (operation) DO NOTHING",
                (operation, self._mint(), time.time()),
            )
            row = conn.execute(
                "SELECT key FROM idempotency_keys WHERE operation = ?", (operation,)
            ).fetchone()
        return str(row[0])

    def forget(self, operation: str) -> None:
        """Drop ``operation``'s key (no error if there is none)."""
        with self._connect() as conn:
            conn.execute("DELETE FROM idempotency_keys WHERE operation = ?", (operation,))

    def prune(self, older_than: float) -> int:
        """Drop keys minted more than ``older_than`` seconds ago; returns how many.

        Keep keys at least as long as the server's retention window (24 h by
        default): within it, a retry with the old key is still recognised.
        """
        with self._connect() as conn:
            cursor = conn.execute(
                "DELETE FROM idempotency_keys WHERE created_at < ?", (time.time() - older_than,)
            )
            return int(cursor.rowcount)

    def __len__(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])
