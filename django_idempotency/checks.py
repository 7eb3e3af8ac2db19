"""System checks for misconfiguration, with stable ids (``django_idempotency.E001``...).

Each check is documented in ``docs/checks.md`` with its fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.urls import URLPattern, URLResolver, get_resolver

from .conf import DEFAULTS, conf
from .decorators import DECORATED
from .responses import FORBIDDEN_HEADERS


@register()
def check_settings(app_configs: list[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate ``settings.IDEMPOTENCY`` (E001-E005)."""
    raw = getattr(settings, "IDEMPOTENCY", {})
    if not isinstance(raw, dict):
        return [
            Error(
                "IDEMPOTENCY must be a dict.",
                hint="Set IDEMPOTENCY = {} or a dict of the documented keys.",
                id="django_idempotency.E001",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"Unknown IDEMPOTENCY setting(s): {', '.join(unknown)}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="django_idempotency.E001",
            )
        )
    try:
        max_length = conf.max_key_length
    except (TypeError, ValueError):
        max_length = -1
    if not 1 <= max_length <= 255:
        errors.append(
            Error(
                "IDEMPOTENCY['MAX_KEY_LENGTH'] must be an integer from 1 to 255.",
                hint="Keys are stored in a 255-character column; 255 is the default.",
                id="django_idempotency.E002",
            )
        )
    errors.extend(_check_durations())
    forbidden = sorted(h for h in conf.replay_headers if h.lower() in FORBIDDEN_HEADERS)
    if forbidden:
        errors.append(
            Error(
                f"IDEMPOTENCY['REPLAY_HEADERS'] names headers that are never stored or "
                f"replayed: {', '.join(forbidden)}.",
                hint="Credentials, cookies, hop-by-hop and tracing headers belong to one "
                "request; remove them from REPLAY_HEADERS.",
                id="django_idempotency.E004",
            )
        )
    for name in ("PRINCIPAL_RESOLVER", "RELEASE_PREDICATE"):
        try:
            getattr(conf, name.lower())
        except ImportError as exc:
            errors.append(
                Error(
                    f"IDEMPOTENCY['{name}'] cannot be imported: {exc}.",
                    hint="Give a dotted path to a callable, or the callable itself.",
                    id="django_idempotency.E005",
                )
            )
    return errors


def _check_durations() -> Iterator[CheckMessage]:
    try:
        lease, retention, wait = conf.lease, conf.retention, conf.wait
    except (TypeError, ValueError):
        lease = retention = wait = -1.0
    if lease <= 0 or retention <= 0 or wait < 0:
        yield Error(
            "IDEMPOTENCY['LEASE'] and ['RETENTION'] must be positive numbers of seconds "
            "and ['WAIT'] zero or more.",
            hint="Defaults: LEASE 60, RETENTION 86400 (24 h), WAIT 0.",
            id="django_idempotency.E003",
        )
    elif lease >= retention:
        yield Error(
            "IDEMPOTENCY['LEASE'] must be shorter than ['RETENTION'].",
            hint="A record must outlive its lease, or an in-flight request could be "
            "forgotten before it finishes.",
            id="django_idempotency.E003",
        )


def _patterns(patterns: list[Any]) -> Iterator[URLPattern]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _patterns(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            yield pattern


@register(Tags.urls)
def check_atomic_requests(
    app_configs: list[AppConfig] | None = None, **kwargs: Any
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
    warnings: list[CheckMessage] = []
    seen: set[int] = set()
    for pattern in _patterns(get_resolver().url_patterns):
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
        exempt = getattr(callback, "_non_atomic_requests", set())
        if decorated and not all(alias in exempt for alias in atomic_aliases):
            warnings.append(
                Warning(
                    f"{view_class.__qualname__} has @idempotent methods "
                    f"({', '.join(decorated)}) but runs inside ATOMIC_REQUESTS, so its "
                    "claims cannot commit on their own: duplicates will wait for the "
                    "original instead of getting a 409.",
                    hint="For an APIView, add IdempotentMixin to the class (it exempts "
                    "the view and opens the transaction itself) or decorate its dispatch "
                    "with @method_decorator(transaction.non_atomic_requests, "
                    "name='dispatch'). For an @api_view function, put @idempotent "
                    "above @api_view.",
                    obj=view_class,
                    id="django_idempotency.W001",
                )
            )
    return warnings
