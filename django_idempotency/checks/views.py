"""System checks on the idempotent views of the URLconf (docs/checks.md).

W001 (``ATOMIC_REQUESTS`` around a claim), W002 (a retention past ``MAX_RETENTION``),
W005 (``transaction.atomic`` above ``@idempotent``) and E008 (``idempotent_actions``
naming an action the view lacks); E010 is in ``stacking``. Each is documented in
docs/checks.md with its fix.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import transaction

from django_idempotency.checks.urls import (
    as_duration,
    label,
    protected_endpoints,
    url_patterns,
    wraps_function,
)
from django_idempotency.conf import conf
from django_idempotency.protocol import endpoints
from django_idempotency.protocol.decorators import DECORATED


@register(Tags.urls)
def check_view_retention(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W002: a view keeps responses longer than ``MAX_RETENTION``, the partitions' horizon.

    Its records are still kept for their whole window; on a partitioned PostgreSQL
    table, though, its claims may land in the default partition (the sweeper creates
    days ahead only up to ``MAX_RETENTION``), and wait there until the sweeper creates
    their day.
    """
    try:
        limit = conf.max_retention
    except (TypeError, ValueError):
        return []  # reported by E006
    warnings: list[CheckMessage] = []
    seen: set[tuple[int, float]] = set()
    for obj, options, _kind in protected_endpoints():
        value = options.get("retention") if isinstance(options, dict) else options.retention
        try:
            seconds = float(value) if value is not None else None
        except (TypeError, ValueError):
            continue
        if seconds is None or seconds <= limit or (id(obj), seconds) in seen:
            continue
        seen.add((id(obj), seconds))
        warnings.append(
            Warning(
                f"{label(obj)} declares a retention of "
                f"{as_duration(seconds)}, longer than IDEMPOTENCY['MAX_RETENTION'] "
                f"({as_duration(limit)}). Its keys are kept for their whole window, but on a "
                "partitioned PostgreSQL table its records may land in the default "
                "partition, beyond the days the sweeper creates ahead.",
                hint="Raise MAX_RETENTION to the longest retention of any view: the "
                "sweeper then creates every partition a claim needs ahead of time.",
                obj=label(obj),
                id="django_idempotency.W002",
            )
        )
    return warnings


@register(Tags.urls)
def check_atomic_requests(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W001: ``ATOMIC_REQUESTS`` with class views whose methods are ``@idempotent``.

    Django opens the request's transaction before the view class runs, so the claim
    cannot commit on its own. It then joins that transaction: still correct, but a
    duplicate waits for the original to finish instead of getting a fast 409.
    """
    atomic_aliases = {
        alias for alias, db in settings.DATABASES.items() if db.get("ATOMIC_REQUESTS")
    }
    if not atomic_aliases:
        return []
    warnings: list[CheckMessage] = _integrations_in_atomic_requests(atomic_aliases)
    seen: set[int] = set()
    for pattern in url_patterns():
        callback = pattern.callback
        view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
        if view_class is None or id(callback) in seen:
            continue
        seen.add(id(callback))
        decorated = [
            name
            for name in dir(view_class)
            if hasattr(getattr(view_class, name, None), "_idempotency_options")
        ]
        if (view_class.__module__, view_class.__name__) in DECORATED:
            decorated.append(view_class.__name__)  # @idempotent below @api_view
        exempt: Container[str] = getattr(callback, "_non_atomic_requests", set())
        if decorated and not all(alias in exempt for alias in atomic_aliases):
            if wraps_function(view_class):
                what = f"The @api_view function {label(view_class)} is @idempotent"
            else:
                what = f"{label(view_class)} has @idempotent methods ({', '.join(decorated)})"
            warnings.append(
                Warning(
                    f"{what} but runs inside ATOMIC_REQUESTS, so its "
                    "claims cannot commit on their own: duplicates will wait for the "
                    "original instead of getting a 409.",
                    hint="For an APIView, add IdempotentMixin to the class (it exempts "
                    "the view and opens the transaction itself) or decorate its dispatch "
                    "with @method_decorator(transaction.non_atomic_requests, "
                    "name='dispatch'). For an @api_view function, put @idempotent "
                    "above @api_view.",
                    obj=label(view_class),
                    id="django_idempotency.W001",
                )
            )
    return warnings


#: How to exempt the URL views of an integration from ``ATOMIC_REQUESTS``, by kind.
_EXEMPT_HINTS = {
    "ninja": "Mount the API with django_idempotency.contrib.ninja.api_urls(api) instead "
    "of api.urls: its URL views claim first, then run each operation in its own "
    "transaction (docs/ninja.md).",
}


def _integrations_in_atomic_requests(atomic_aliases: set[str]) -> list[CheckMessage]:
    """W001 for the protected endpoints of integrations (Ninja) inside ATOMIC_REQUESTS."""
    warnings: list[CheckMessage] = []
    seen: set[int] = set()
    for pattern in url_patterns():
        callback = pattern.callback
        exempt: Container[str] = getattr(callback, "_non_atomic_requests", set())
        if all(alias in exempt for alias in atomic_aliases):
            continue
        for obj, _options, kind in endpoints.found(callback):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            warnings.append(
                Warning(
                    f"{label(obj)} is @idempotent but its URL view runs inside "
                    "ATOMIC_REQUESTS, so its claims cannot commit on their own: "
                    "duplicates will wait for the original instead of getting a 409.",
                    hint=_EXEMPT_HINTS.get(
                        kind,
                        "Exempt its URL view from ATOMIC_REQUESTS "
                        "(transaction.non_atomic_requests).",
                    ),
                    obj=label(obj),
                    id="django_idempotency.W001",
                )
            )
    return warnings


@register(Tags.urls)
def check_mixin_actions(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E008: ``idempotent_actions`` names an action the routed view does not have.

    A misspelt action (``"craete"``), or a ViewSet action name on an APIView (whose
    actions are its method names, ``"post"``), would leave the real action silently
    unprotected.
    """
    errors: list[CheckMessage] = []
    seen: set[type] = set()
    for pattern in url_patterns():
        callback = pattern.callback
        view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
        actions = getattr(view_class, "idempotent_actions", None)
        if view_class is None or actions is None or view_class in seen:
            continue
        seen.add(view_class)
        missing = sorted(name for name in actions if not callable(getattr(view_class, name, None)))
        if missing:
            errors.append(
                Error(
                    f"{view_class.__qualname__}.idempotent_actions names "
                    f"{', '.join(repr(n) for n in missing)}, which the view does not have: "
                    "those actions are not protected.",
                    hint="Use the ViewSet's action names (create, update, partial_update, "
                    "destroy, or an @action's name) or, on an APIView, its method names "
                    "(post, put, patch, delete).",
                    obj=view_class,
                    id="django_idempotency.E008",
                )
            )
    return errors


def _is_atomic(value: object) -> bool:
    return value is transaction.atomic or isinstance(value, transaction.Atomic)


def closure(func: Any) -> list[Any]:
    """The values ``func`` closes over (empty cells left out)."""
    values = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return values


def _atomic_wrapper(func: Any) -> bool:
    """Whether ``func`` is the wrapper ``transaction.atomic`` leaves as a decorator.

    ``@transaction.atomic`` (a ``ContextDecorator``) returns a function closing over
    its ``Atomic`` instance; ``@method_decorator(transaction.atomic)`` one closing over
    the list of decorators it applies. Both set ``__wrapped__``.
    """
    for value in closure(func):
        if _is_atomic(value):
            return True
        if isinstance(value, (list, tuple)) and any(_is_atomic(v) for v in value):
            return True
    return False


def _idempotent_wrapper(func: Any) -> bool:
    """Whether ``func`` is the function ``@idempotent`` returned (not a copy above it)."""
    inner = getattr(func, "__wrapped__", None)
    return hasattr(func, "_idempotency_options") and not hasattr(inner, "_idempotency_options")


def _atomic_above_idempotent(func: Any) -> bool:
    """Whether an atomic wrapper sits above ``@idempotent`` among ``func``'s decorators."""
    atomic = False
    for _depth in range(32):  # a chain of decorators, never a cycle
        if func is None:
            return False
        if _atomic_wrapper(func):
            atomic = True
        elif _idempotent_wrapper(func):
            return atomic
        inner = getattr(func, "__wrapped__", None)
        if inner is None:  # DRF's @api_view handler calls the function it closes over
            called = [value for value in closure(func) if callable(value)]
            inner = called[0] if len(called) == 1 else None
        func = inner
    return False


def _atomic_chain(func: Any) -> bool:
    """Whether ``func`` or a function it wraps is an atomic wrapper."""
    for _depth in range(32):
        if func is None:
            return False
        if _atomic_wrapper(func):
            return True
        func = getattr(func, "__wrapped__", None)
    return False


def handler_names(view_class: type) -> list[str]:
    """Names of a class's handlers that may claim: HTTP methods and decorated methods."""
    names = set(getattr(view_class, "http_method_names", ()))
    names.update(
        n for n in dir(view_class) if hasattr(getattr(view_class, n, None), "_idempotency_options")
    )
    return sorted(names)


def _class_is_idempotent(view_class: type) -> bool:
    return (
        hasattr(view_class, "idempotency_options_for")  # IdempotentMixin
        or (view_class.__module__, view_class.__name__) in DECORATED  # below @api_view
        or any(
            hasattr(getattr(view_class, name, None), "_idempotency_options")
            for name in dir(view_class)
        )
    )


def _outer_atomic(callback: Any) -> tuple[Any, str] | None:
    """(object, where) when a ``transaction.atomic`` decorator wraps a claim of a URL."""
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return (callback, "the view function") if _atomic_above_idempotent(callback) else None
    if _class_is_idempotent(view_class):
        if _atomic_chain(callback):
            return view_class, "the view returned by as_view()"
        if _atomic_chain(getattr(view_class, "dispatch", None)):
            return view_class, "its dispatch method"
    for name in handler_names(view_class):
        if _atomic_above_idempotent(getattr(view_class, name, None)):
            return view_class, f"its {name} method"
    return None


@register(Tags.urls)
def check_outer_atomic(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W005: ``transaction.atomic`` above ``@idempotent``: claims join that transaction.

    The claim must commit on its own, before the view runs, for a duplicate to get a
    fast 409; inside an outer ``atomic()`` it becomes visible only when that block
    commits. Seen statically: ``transaction.atomic`` used as a decorator (on the
    function, on a handler, on ``dispatch`` through ``method_decorator``, or around
    ``as_view()``). A ``with transaction.atomic()`` in a caller or a middleware is seen
    at run time only (``exceptions.OuterTransactionWarning``).
    """
    warnings: list[CheckMessage] = []
    seen: set[int] = set()
    for pattern in url_patterns():
        found = _outer_atomic(pattern.callback)
        if found is None or id(found[0]) in seen:
            continue
        obj, where = found
        seen.add(id(obj))
        name = obj.__qualname__
        if name.endswith("WrappedAPIView"):  # @api_view's class is named after the function
            name = obj.__name__
        warnings.append(
            Warning(
                f"{obj.__module__}.{name} is idempotent, but {where} is wrapped "
                "in transaction.atomic above the claim, so its claims cannot commit on their "
                "own: duplicates will wait for the original instead of getting a 409.",
                hint="Remove that transaction.atomic: @idempotent already runs the view in "
                "transaction.atomic() and commits the stored response with its writes. If "
                "the view needs its own block, put @transaction.atomic below @idempotent "
                "(or use `with transaction.atomic()` inside the handler).",
                obj=obj,
                id="django_idempotency.W005",
            )
        )
    return warnings
