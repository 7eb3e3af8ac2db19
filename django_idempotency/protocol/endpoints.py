"""The finders of protected endpoints behind a URL, one per kind of view.

The system checks (``checks.urls.protected_endpoints``) list every protected endpoint
of the URLconf: ``@idempotent`` views and ``IdempotentMixin`` actions, which the checks
know, and those of an integration that registers its finder here when it is imported
(Django Ninja's operations, ``contrib.ninja``). A URLconf that routes to them imports
the integration first, so its finder is registered before the checks walk the URLs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple


class Endpoint(NamedTuple):
    """A protected endpoint behind a URL, as the checks report it.

    Attributes:
        obj: what its author wrote (a function, a view class, a Ninja operation's
            function): the checks name it by its module and qualified name.
        options: its idempotency options (an ``Options``, or the keyword options of
            ``idempotency_options`` / ``idempotent_actions`` as a dict).
        kind: ``"view"`` (``@idempotent``, ``IdempotentMixin``) or the kind its
            finder was registered under (``"ninja"``).
    """

    obj: Any
    options: Any
    kind: str


#: ``callback -> (obj, options)`` pairs of the endpoints a URL's view serves.
Finder = Callable[[Any], Iterable[tuple[Any, Any]]]

_FINDERS: dict[str, Finder] = {}


def register(kind: str, finder: Finder) -> None:
    """Register ``finder`` for the endpoints of ``kind`` (again: replaced, not doubled).

    Args:
        kind: a short name of the kind of view (``"ninja"``).
        finder: called with each URL pattern's callback; yields ``(obj, options)`` for
            each protected endpoint behind it, nothing for a view it does not know.
            It never raises for a callback of another kind.
    """
    _FINDERS[kind] = finder


def found(callback: Any) -> Iterator[Endpoint]:
    """The endpoints every registered finder sees behind ``callback``."""
    for kind, finder in list(_FINDERS.items()):
        for obj, options in finder(callback):
            yield Endpoint(obj, options, kind)
