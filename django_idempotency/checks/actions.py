"""W011: a mutating action of an ``IdempotentMixin`` view neither protected nor exempt.

A view that lists its protected actions (``idempotent_actions``) runs every other
action without a claim: a client's ``Idempotency-Key`` sent to one of them is ignored,
and a retry runs it again. Leaving an action out must be a choice the code states
(``idempotency_exempt_actions``); the check names the mutating actions that are
neither (docs/checks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Tags, Warning, register

from django_idempotency.checks.urls import label, url_patterns
from django_idempotency.protocol.begin import SAFE_METHODS
from django_idempotency.protocol.drf import closure_options


def _mutating_actions(callback: Any, view_class: type) -> set[str]:
    """The actions of unsafe methods a URL routes to ``view_class``.

    A ViewSet's URL view knows its routing (``actions``: method to action name, as the
    router or ``as_view({...})`` gave it); an ``APIView``'s actions are its handlers'
    method names.
    """
    routed = getattr(callback, "actions", None)
    if isinstance(routed, dict):
        return {str(name) for method, name in routed.items() if method.upper() not in SAFE_METHODS}
    return {
        method
        for method in getattr(view_class, "http_method_names", ())
        if method.upper() not in SAFE_METHODS and callable(getattr(view_class, method, None))
    }


def _protected(view_class: type, action: str) -> bool:
    """Whether ``action`` claims: listed in ``idempotent_actions``, or ``@idempotent``."""
    handler = getattr(view_class, action, None)
    if hasattr(handler, "_idempotency_options") or closure_options(handler) is not None:
        return True
    listed = view_class.idempotent_actions  # type: ignore[attr-defined]
    return listed is None or action in listed


@register(Tags.urls)
def check_unlisted_actions(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W011: mutating actions of an ``IdempotentMixin`` view neither protected nor exempt.

    Only views with ``idempotent_actions`` set (``None`` protects every unsafe handler):
    each action of an unsafe method that the URLconf routes to the view, that is not
    listed there, not ``@idempotent`` itself and not in
    ``idempotency_exempt_actions``. One message per view, naming every such action.
    """
    unlisted: dict[type, set[str]] = {}
    for pattern in url_patterns():
        callback = pattern.callback
        view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
        if not isinstance(view_class, type) or not hasattr(view_class, "idempotent_actions"):
            continue
        if view_class.idempotent_actions is None:
            continue
        exempt = set(getattr(view_class, "idempotency_exempt_actions", ()))
        found = unlisted.setdefault(view_class, set())
        found.update(
            action
            for action in _mutating_actions(callback, view_class)
            if action not in exempt and not _protected(view_class, action)
        )
    warnings: list[CheckMessage] = []
    for view_class, actions in unlisted.items():
        if not actions:
            continue
        names = ", ".join(repr(name) for name in sorted(actions))
        warnings.append(
            Warning(
                f"{label(view_class)} runs {names} without idempotency: neither in "
                "idempotent_actions nor in idempotency_exempt_actions. A client's "
                "Idempotency-Key sent to them is ignored, and a retry runs them again.",
                hint="Protect each (add it to idempotent_actions) or exempt it by name: "
                f"idempotency_exempt_actions = [{names}].",
                obj=label(view_class),
                id="django_idempotency.W011",
            )
        )
    return warnings
