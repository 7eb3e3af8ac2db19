"""The URLconf as the view checks read it, and the idempotent views behind it (W009).

:func:`url_patterns` never raises: without ``ROOT_URLCONF`` there is nothing to
inspect, and a URLconf that cannot be imported is reported once by W009 (with its
error) while every other check still runs. :func:`protected_endpoints` is the one
listing of the protected endpoints the checks inspect: ``@idempotent`` functions and
methods (above or below ``@api_view``), ``IdempotentMixin`` classes
(:func:`view_options`), and the endpoints of integrations that register a finder
(``protocol.endpoints``: Django Ninja's operations).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register
from django.urls import URLPattern, URLResolver, get_resolver

from django_idempotency.protocol import endpoints
from django_idempotency.protocol.endpoints import Endpoint


def label(obj: Any) -> str:
    """The dotted path of a view as its author wrote it.

    DRF's ``@api_view`` turns a function into a class named ``WrappedAPIView``, given the
    function's module and name: the function's path is what the author knows.
    """
    name = obj.__name__ if wraps_function(obj) else obj.__qualname__
    return f"{obj.__module__}.{name}"


def wraps_function(obj: Any) -> bool:
    """Whether ``obj`` is the class DRF's ``@api_view`` made of a function."""
    return isinstance(obj, type) and obj.__qualname__.endswith("WrappedAPIView")


def as_duration(value: float) -> str:
    """A duration for a message: ``2592000 s (30 days)``, never ``2.592e+06 s``."""
    text = f"{value:.0f} s" if float(value).is_integer() else f"{value} s"
    return f"{text} ({value / 86400:g} days)" if value >= 86400 else text


def view_options(callback: Any) -> Iterator[tuple[Any, Any]]:
    """(object, Options or options dict) of every idempotent handler behind a URL."""
    if hasattr(callback, "_idempotency_options"):
        yield callback, callback._idempotency_options
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return
    for name in dir(view_class):
        handler: Any = getattr(view_class, name, None)
        if hasattr(handler, "_idempotency_options"):
            yield view_class, handler._idempotency_options
        # @idempotent below @api_view: DRF's handler closes over the decorated function.
        for cell in getattr(handler, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(inner) and hasattr(inner, "_idempotency_options"):
                yield view_class, inner._idempotency_options
    base = getattr(view_class, "idempotency_options", None)
    if isinstance(base, dict):
        yield view_class, base
    actions = getattr(view_class, "idempotent_actions", None)
    if isinstance(actions, dict):
        for options in actions.values():
            yield view_class, options


def protected_endpoints(urlconf: str | None = None) -> list[Endpoint]:
    """Every protected endpoint behind the URLconf, of every kind, in URL order.

    ``@idempotent`` views, ``IdempotentMixin`` views (``kind`` ``"view"``) and the
    endpoints of registered integrations (``"ninja"``: each protected operation of a
    mounted ``NinjaAPI``). An endpoint routed by several URLs is listed once per URL;
    the checks report each once. Never raises (see :func:`url_patterns`).

    Args:
        urlconf: the dotted path of another URLconf to walk (django-tenants'
            ``PUBLIC_SCHEMA_URLCONF``); ``None``: ``ROOT_URLCONF``.
    """
    listed: list[Endpoint] = []
    for pattern in url_patterns(urlconf):
        listed.extend(Endpoint(obj, opts, "view") for obj, opts in view_options(pattern.callback))
        listed.extend(endpoints.found(pattern.callback))
    return listed


def _patterns(patterns: list[Any]) -> Iterator[URLPattern]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _patterns(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            yield pattern


def _read_urlconf(urlconf: str | None = None) -> tuple[list[URLPattern], str | None]:
    """(every URL pattern of the root URLconf (or ``urlconf``), why it could not be read).

    No ``ROOT_URLCONF`` (a worker's settings module) means no views: nothing to read and
    nothing to report. An exception while importing the URLconf or one it includes
    (``ImportError``, or any error its code raises) is the reason.
    """
    if urlconf is None and not getattr(settings, "ROOT_URLCONF", None):
        return [], None
    try:
        return list(_patterns(get_resolver(urlconf).url_patterns)), None
    except Exception as exc:  # a system check reports, it never crashes the command
        return [], f"{type(exc).__name__}: {exc}"


def url_patterns(urlconf: str | None = None) -> list[URLPattern]:
    """Every ``URLPattern`` of the root URLconf, includes walked; empty if it cannot be read.

    Never raises: the checks that walk the URLconf then have nothing to inspect, and
    W009 (:func:`check_urlconf_readable`) says why, once.

    Args:
        urlconf: the dotted path of another URLconf to walk (django-tenants'
            ``PUBLIC_SCHEMA_URLCONF``); ``None``: ``ROOT_URLCONF``.
    """
    return _read_urlconf(urlconf)[0]


@register(Tags.urls)
def check_urlconf_readable(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W009: the URLconf cannot be imported, so the checks of the views did not run.

    Reported once for all of them (W001, W002, W005, W008, W011, E008, E009, E010); a
    settings module without ``ROOT_URLCONF`` serves no views and gets no message.
    """
    reason = _read_urlconf()[1]
    if reason is None:
        return []
    return [
        Warning(
            f"The URL configuration {settings.ROOT_URLCONF!r} could not be imported "
            f"({reason}), so django-idempotency could not inspect the views: W001, W002, "
            "W005, W008, W011, E008, E009 and E010 did not check them.",
            hint=f"Fix the error: `python -c 'import {settings.ROOT_URLCONF}'` shows where "
            "it happens. Then run the checks again.",
            obj=str(settings.ROOT_URLCONF),
            id="django_idempotency.W009",
        )
    ]
