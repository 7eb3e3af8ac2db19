"""A fake hypervisor. Real ones are slow and live outside our database."""

from __future__ import annotations

import time

from django.conf import settings


def boot(worker_id: str) -> str:
    """Start a worker; returns its state.

    Takes ``LEASEBROKER_BOOT_SECONDS`` (default 0: instant). The retry-storm demo
    makes it slow to kill a server process in the middle of a create.
    """
    seconds = float(getattr(settings, "LEASEBROKER_BOOT_SECONDS", 0.0))
    if seconds > 0:
        time.sleep(seconds)
    return "running"


def reboot(worker_id: str) -> None:
    """Reboot a worker, taking ``LEASEBROKER_REBOOT_SECONDS`` (default 1.0) seconds.

    The view calls it *before* writing to the database. On SQLite this matters: a
    transaction that has written holds the database's single write lock, so a
    duplicate request would queue behind it (and then see a replay) instead of
    seeing the committed claim and getting 409 at once.
    """
    time.sleep(float(getattr(settings, "LEASEBROKER_REBOOT_SECONDS", 1.0)))
