"""App configuration; ``ready()`` registers the system checks and the log receivers."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    """``django_idempotency`` app."""

    name = "django_idempotency"
    label = "django_idempotency"
    verbose_name = _("Idempotency")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks (``django_idempotency.E001`` ...) and the log receivers."""
        from django_idempotency import logs
        from django_idempotency.checks import (
            actions,
            databases,
            functions,
            settings,
            stacking,
            tenants,
            urls,
            views,
        )

        del actions, databases, functions, settings, stacking, tenants, urls, views  # register
        logs.connect()
