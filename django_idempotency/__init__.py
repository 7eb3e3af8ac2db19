"""django-idempotency: safe retries of mutating HTTP requests for Django and DRF.

The names a view needs, importable from the package itself::

    from django_idempotency import IdempotentMixin, idempotent

* :func:`idempotent`: the decorator for function views and view methods;
* :class:`IdempotentMixin`: for DRF ``APIView`` and ``ViewSet`` classes;
* :func:`current`: the :class:`IdempotencyContext` of the idempotent view (or
  ``inbox.once()`` block) running now, also ``request.idempotency``;
* :func:`derive_key`: a stable sub-key for a downstream system (docs/phases.md);
* :class:`ReplayNegotiation`: DRF content negotiation that lets replays through whatever
  the retry's ``Accept`` (docs/protocol.md).

The rest of the public surface lives in modules named for what it does:
``exceptions``, ``outbox``, ``inbox``, ``principals``, ``extractors``, ``signals``,
``metrics``, ``retention``, ``store`` (operators' functions), ``testing``, ``client``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "IdempotencyContext",
    "IdempotentMixin",
    "ReplayNegotiation",
    "current",
    "derive_key",
    "idempotent",
]

if TYPE_CHECKING:
    from django_idempotency.protocol.context import IdempotencyContext, current
    from django_idempotency.protocol.decorators import idempotent
    from django_idempotency.protocol.drf import IdempotentMixin, ReplayNegotiation
    from django_idempotency.protocol.keys import derive_key

#: Where each public name is defined, imported on first use so that importing the
#: package (from settings, say) never pulls in models or DRF before Django is ready.
_HOMES = {
    "IdempotencyContext": "django_idempotency.protocol.context",
    "IdempotentMixin": "django_idempotency.protocol.drf",
    "ReplayNegotiation": "django_idempotency.protocol.drf",
    "current": "django_idempotency.protocol.context",
    "derive_key": "django_idempotency.protocol.keys",
    "idempotent": "django_idempotency.protocol.decorators",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'django_idempotency' has no attribute {name!r}")
    return getattr(import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
