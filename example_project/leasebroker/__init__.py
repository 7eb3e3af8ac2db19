"""leasebroker: the django-idempotency example project."""

from __future__ import annotations

try:  # Celery is optional: the API runs without it (the relay then runs by command)
    from .celery import app as celery_app
except ImportError:  # pragma: no cover
    celery_app = None

__all__ = ["celery_app"]
