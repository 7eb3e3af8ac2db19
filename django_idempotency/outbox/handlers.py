"""The outbox's handler registry: which function delivers which topic.

A handler is registered per topic with ``@outbox.handler("worker.boot")`` (the same
function as :func:`register`, re-exported by ``django_idempotency.outbox``). The relay
(``outbox.relay``) looks handlers up here, so it needs neither
``outbox`` nor Celery: imports run one way, ``tasks -> relay -> handlers`` and
``outbox -> handlers``. See docs/outbox.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.utils.module_loading import autodiscover_modules

from django_idempotency.models import OutboxMessage

Handler = Callable[[OutboxMessage, str], Any]
H = TypeVar("H", bound=Handler)

#: Module looked for in every installed app by :func:`autodiscover`.
HANDLER_MODULE = "outbox_handlers"
_handlers: dict[str, Handler] = {}
_discovered = False


def register(topic: str) -> Callable[[H], H]:
    """Register the decorated function as the handler of ``topic``.

    The handler is called as ``handler(message, dedup_key)`` by the relay, outside
    any transaction the relay holds, at least once per message: pass ``dedup_key``
    downstream (as an idempotency key or request id) so redeliveries are harmless.
    Raising marks the attempt failed (retried with backoff, dead-lettered at the
    last attempt); returning marks the message sent.

    Args:
        topic: the topic the function delivers (``"worker.boot"``).

    Raises:
        ValueError: another function is already registered for ``topic``.
    """

    def decorator(func: H) -> H:
        existing = _handlers.get(topic)
        if existing is not None and _name(existing) != _name(func):
            raise ValueError(
                f"outbox topic {topic!r} already has the handler {_name(existing)}; "
                f"cannot register {_name(func)} too."
            )
        _handlers[topic] = func
        return func

    return decorator


def unregister(topic: str) -> None:
    """Forget the handler of ``topic`` (tests, reloading); no error if there is none."""
    _handlers.pop(topic, None)


def get_handler(topic: str) -> Handler | None:
    """The handler registered for ``topic``, or ``None``."""
    return _handlers.get(topic)


def autodiscover() -> None:
    """Import ``<app>.outbox_handlers`` for every installed app, once per process."""
    global _discovered
    if not _discovered:
        autodiscover_modules(HANDLER_MODULE)
        _discovered = True


def _name(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"
