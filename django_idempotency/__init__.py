"""django-idempotency: safe retries of mutating HTTP requests for Django and DRF.

Public API::

    from django_idempotency import idempotent, IdempotentMixin
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["IdempotentMixin", "idempotent"]

if TYPE_CHECKING:
    from .decorators import idempotent
    from .drf import IdempotentMixin


def __getattr__(name: str) -> Any:
    # Imported lazily so that importing the package (e.g. from settings) never pulls
    # in models or DRF before Django is ready.
    if name == "idempotent":
        from .decorators import idempotent

        return idempotent
    if name == "IdempotentMixin":
        from .drf import IdempotentMixin

        return IdempotentMixin
    raise AttributeError(f"module 'django_idempotency' has no attribute {name!r}")
