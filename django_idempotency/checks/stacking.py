"""E010: protection stacked where it cannot work, seen in the routed views (docs/checks.md).

``@idempotent`` on a method of the view's machinery (a DRF view's ``dispatch``, where
the claim would run before authentication), a subclass's ``initial()`` that does not
call ``super()`` (the mixin's never runs), or two ``@idempotent`` on one handler.
What can be known when a class is defined or a function decorated is refused there
(``TypeError``); this check sees what only the URLconf shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register

from django_idempotency.checks.urls import (
    label,
    url_patterns,
)
from django_idempotency.checks.views import closure, handler_names
from django_idempotency.protocol.decorators import is_idempotent_layer
from django_idempotency.protocol.drf import shadowing


def _idempotent_layers(func: Any) -> int:
    """How many ``@idempotent`` layers ``func``'s chain of decorators holds."""
    layers = 0
    for _depth in range(32):  # a chain of decorators, never a cycle
        if func is None:
            break
        layers += is_idempotent_layer(func)
        inner = getattr(func, "__wrapped__", None)
        if inner is None:  # DRF's @api_view handler calls the function it closes over
            called = [value for value in closure(func) if callable(value)]
            inner = called[0] if len(called) == 1 else None
        func = inner
    return layers


def _machinery(view_class: type) -> set[str]:
    """Names of a class-based view's own machinery that ``@idempotent`` cannot protect.

    DRF's views: every method of ``APIView`` (and ``ViewSetMixin``) that is not an HTTP
    handler: ``dispatch``, ``initial``, ``initialize_request``, ``finalize_response``...
    Django's views: the same of ``View`` but ``dispatch``, which receives the request
    and returns the response (``@idempotent`` there protects every handler).
    """
    from django.views import View
    from rest_framework.views import APIView
    from rest_framework.viewsets import ViewSetMixin

    bases: list[type] = []
    if issubclass(view_class, APIView):
        bases.append(APIView)
        if issubclass(view_class, ViewSetMixin):
            bases.append(ViewSetMixin)
    elif issubclass(view_class, View):
        bases.append(View)
    names = {n for base in bases for n in vars(base) if not n.startswith("__")}
    names -= set(getattr(view_class, "http_method_names", ()))
    if bases == [View]:
        names.discard("dispatch")
    return names


def _misplaced(view_class: type) -> Iterator[tuple[str, str]]:
    """(message, hint) for each way ``view_class``'s idempotency cannot work as built."""
    for name in sorted(_machinery(view_class)):
        if not hasattr(getattr(view_class, name, None), "_idempotency_options"):
            continue
        drf = hasattr(view_class, "finalize_response")
        why = (
            "the claim would run before DRF's authentication, permissions and "
            "throttling, and a replay would skip them"
            if drf and name in ("dispatch", "initialize_request", "initial")
            else "what it returns is not the view's response"
        )
        yield (
            f"{label(view_class)}.{name}() is @idempotent, but {name}() is part of the "
            f"view's machinery, not a handler: {why}.",
            "Decorate the handlers instead (post, put, patch, delete, or a ViewSet's "
            "action), or put IdempotentMixin first in the bases of a DRF view.",
        )
    for name in handler_names(view_class):
        if _idempotent_layers(getattr(view_class, name, None)) > 1:
            yield (
                f"{label(view_class)}.{name}() is @idempotent twice (once through "
                "method_decorator): every request would be claimed twice with its key, "
                "and would fail.",
                "Keep one @idempotent on it.",
            )
    for name, klass in shadowing(view_class):
        yield (
            f"{klass.__module__}.{klass.__qualname__}.{name}() does not call "
            f"super().{name}(), so IdempotentMixin's {name}() never runs: "
            f"{label(view_class)} is not protected (a request without a key runs, a "
            "retry runs again).",
            f"Call super().{name}(...) in it, passing its arguments on. If it does "
            "through a decorator that hides its code, silence this check for it.",
        )


@register(Tags.urls)
def check_misplaced_protection(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E010: a routed view's protection cannot work as its code is stacked.

    What is seen only once the view is routed (``@idempotent`` and
    ``IdempotentMixin`` refuse, with ``TypeError``, what they can see when applied): a
    view's machinery method made ``@idempotent`` (``dispatch`` of a DRF view, through
    ``method_decorator``: the claim would run before authentication), or a subclass of
    an ``IdempotentMixin`` view that overrides ``initial`` (``as_view``,
    ``get_content_negotiator``) without calling ``super()``.
    """
    errors: list[CheckMessage] = []
    seen: set[type] = set()
    for pattern in url_patterns():
        callback = pattern.callback
        view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
        if not isinstance(view_class, type) or view_class in seen:
            continue
        seen.add(view_class)
        for message, hint in _misplaced(view_class):
            errors.append(
                Error(message, hint=hint, obj=label(view_class), id="django_idempotency.E010")
            )
    return errors
