from __future__ import annotations

from django.apps import AppConfig


class WorkersConfig(AppConfig):
    """The leasebroker API: workers (fake VMs) and their leases."""

    name = "workers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import notifications  # registers the outbox handler

        del notifications
