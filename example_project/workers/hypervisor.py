"""A fake hypervisor client. Real hypervisors are slow and live outside our database.

Like a real one, the fake keeps its state outside the API's database, in a SQLite file
of its own (``LEASEBROKER_HYPERVISOR_DB``): it survives a crash of the API process and
is not rolled back with the API's transactions. It records every call, and ``boot``
takes a caller-supplied boot id: a boot id it has seen returns the VM of the first boot
instead of starting a second one (as cloud APIs do with client tokens). The create view
passes ``request.idempotency.derive_key("boot")``, so a retried boot converges.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    boot_id TEXT,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS boots (
    boot_id TEXT PRIMARY KEY,
    worker_id TEXT NOT NULL,
    vm_id TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Boot:
    """The VM a boot started (or, for a boot id seen before, had started)."""

    boot_id: str
    worker_id: str
    vm_id: str
    state: str = "running"


class FakeHypervisor:
    """Client of the fake hypervisor whose state lives in the SQLite file ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.executescript(_SCHEMA)
        return db

    def boot(self, worker_id: str, *, boot_id: str) -> Boot:
        """Boot ``worker_id``; the same ``boot_id`` again returns the same VM.

        Takes ``LEASEBROKER_BOOT_SECONDS`` (default 0) *after* the VM started: the
        retry-storm demo kills a server process in that window, when the VM exists
        but the API has not committed it yet.
        """
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO calls (op, worker_id, boot_id, at) VALUES ('boot', ?, ?, ?)",
                (worker_id, boot_id, time.time()),
            )
            db.execute(
                "INSERT OR IGNORE INTO boots (boot_id, worker_id, vm_id) VALUES (?, ?, ?)",
                (boot_id, worker_id, f"vm-{uuid.uuid4().hex[:12]}"),
            )
            owner, vm_id = db.execute(
                "SELECT worker_id, vm_id FROM boots WHERE boot_id = ?", (boot_id,)
            ).fetchone()
            db.execute("COMMIT")
        finally:
            db.close()
        seconds = float(getattr(settings, "LEASEBROKER_BOOT_SECONDS", 0.0))
        if seconds > 0:
            time.sleep(seconds)
        return Boot(boot_id, owner, vm_id)

    def calls(self, op: str = "boot") -> list[tuple[str, str | None]]:
        """Every ``op`` call as (worker id, boot id), oldest first."""
        db = self._connect()
        try:
            rows = db.execute(
                "SELECT worker_id, boot_id FROM calls WHERE op = ? ORDER BY seq", (op,)
            ).fetchall()
        finally:
            db.close()
        return [(worker_id, boot_id) for worker_id, boot_id in rows]

    def boots(self) -> dict[str, Boot]:
        """Every distinct boot, by boot id: what the hypervisor actually started."""
        db = self._connect()
        try:
            rows = db.execute("SELECT boot_id, worker_id, vm_id FROM boots").fetchall()
        finally:
            db.close()
        return {boot_id: Boot(boot_id, worker_id, vm_id) for boot_id, worker_id, vm_id in rows}


def client() -> FakeHypervisor:
    """The hypervisor client configured by ``LEASEBROKER_HYPERVISOR_DB``."""
    return FakeHypervisor(settings.LEASEBROKER_HYPERVISOR_DB)


def reboot(worker_id: str) -> None:
    """Reboot a worker, taking ``LEASEBROKER_REBOOT_SECONDS`` (default 1.0) seconds.

    The view calls it *before* writing to the database. On SQLite this matters: a
    transaction that has written holds the database's single write lock, so a
    duplicate request would queue behind it (and then see a replay) instead of
    seeing the committed claim and getting 409 at once.
    """
    time.sleep(float(getattr(settings, "LEASEBROKER_REBOOT_SECONDS", 1.0)))
