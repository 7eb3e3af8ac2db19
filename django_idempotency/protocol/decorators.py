"""``@idempotent(...)`` for function views and view methods, sync and async."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async

from django_idempotency.protocol.begin import SAFE_METHODS
from django_idempotency.protocol.drf import (
    closure_options,
    function_negotiation,
    replay_negotiation,
)
from django_idempotency.protocol.handle import (
    atomic_requests_blocks,
    find_request,
    make_finalizer,
    mark_non_atomic,
    run,
)
from django_idempotency.protocol.options import Options

F = TypeVar("F", bound=Callable[..., Any])


#: (module, name) of every function decorated with @idempotent, so the W001 check can
#: find ``@api_view`` views whose inner function is idempotent.
DECORATED: set[tuple[str, str]] = set()


def _drf_view_class(func: Callable[..., Any]) -> Any:
    view_class = getattr(func, "view_class", None) or getattr(func, "cls", None)
    if view_class is not None and hasattr(view_class, "finalize_response"):
        return view_class
    return None


def _wrap_api_view(view: Any, decorate: Callable[[Any], Any]) -> Any:
    """``@idempotent`` above ``@api_view``: protect the generated class's handlers.

    The handlers still run inside DRF's ``dispatch``, after authentication,
    permissions and throttling; the view as a whole is exempted from
    ``ATOMIC_REQUESTS`` so its claims commit on their own.
    """
    view_class = _drf_view_class(view)
    if "WrappedAPIView" not in view_class.__qualname__:
        raise TypeError(
            f"@idempotent cannot wrap the class-based view {view_class.__name__!r} from "
            "outside: it would run before authentication and permissions. Decorate its "
            "methods, or add IdempotentMixin to the class."
        )
    for method in view_class.http_method_names:
        handler = view_class.__dict__.get(method)
        if handler is not None and closure_options(handler) is not None:
            raise TypeError(
                f"@api_view function {view_class.__name__!r} is already @idempotent (below "
                "@api_view): a second @idempotent above it would claim every key twice. "
                "Keep one, above @api_view."
            )
    # A replay is the stored representation, whatever the retry's Accept.
    view_class.content_negotiation_class = replay_negotiation(view_class.content_negotiation_class)
    for method in view_class.http_method_names:
        handler = view_class.__dict__.get(method)
        if handler is None:
            continue
        if method.upper() in SAFE_METHODS:
            setattr(view_class, method, _in_atomic_requests(handler))
        else:
            setattr(view_class, method, decorate(handler))
    return mark_non_atomic(view)


def _in_atomic_requests(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` inside the ``ATOMIC_REQUESTS`` blocks its view no longer gets."""

    @wraps(handler)
    def _atomic_handler(*args: Any, **kwargs: Any) -> Any:
        with atomic_requests_blocks():
            return handler(*args, **kwargs)

    return _atomic_handler


def _refuse_unworkable(func: Any) -> None:
    """``TypeError`` for what ``@idempotent`` cannot protect, seen when it is applied.

    A class (decorate its handlers, or use ``IdempotentMixin``); a ``staticmethod`` or
    ``classmethod`` object (the wrapper would be called with ``self``: put
    ``@staticmethod`` above); a function already ``@idempotent`` (each request would be
    claimed twice with one key, the inner claim answering 409 to the outer one). Where
    the mistake shows only once the view is routed (``@idempotent`` on ``dispatch`` of
    a DRF view), the system check E010 reports it.
    """
    name = getattr(func, "__qualname__", None) or repr(func)
    if isinstance(func, type):
        raise TypeError(
            f"@idempotent cannot decorate the class {name}: decorate its handler methods "
            "(post, put, patch, delete) or, on a DRF view, put IdempotentMixin first in "
            "its bases."
        )
    if isinstance(func, (staticmethod, classmethod)):
        kind = type(func).__name__
        raise TypeError(
            f"@idempotent above @{kind} ({name}): the view would be called with the wrong "
            f"arguments. Put @{kind} above @idempotent."
        )
    if hasattr(func, "_idempotency_options"):
        raise TypeError(
            f"{name} is already @idempotent: a second @idempotent (directly, or through "
            "method_decorator) would claim every key twice. Keep one."
        )


def is_idempotent_layer(func: Any) -> bool:
    """Whether ``func`` is one layer of ``@idempotent`` in a chain of decorators.

    That is a wrapper ``@idempotent`` made, or ``method_decorator``'s wrapper applying
    ``@idempotent``. Attributes copied by ``functools.wraps`` do not count: only the
    wrapper's own code, or the decorator it applies, does.
    """
    if getattr(func, "__code__", None) in _WRAPPER_CODES:
        return True
    for cell in getattr(func, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        values = value if isinstance(value, (list, tuple)) else (value,)
        if any(v is idempotent or getattr(v, "__code__", None) is _DECORATOR_CODE for v in values):
            return True
    return False


@overload
def idempotent(view: F, /) -> F: ...
@overload
def idempotent(view: None = None, /, **options: Any) -> Callable[[F], F]: ...


def idempotent(view: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Make a view honour the ``Idempotency-Key`` header (docs/protocol.md, docs/usage.md).

    Use bare (``@idempotent``) or with options (``@idempotent(retention=7 * 86400)``)
    on a function view (``request, ...``), a DRF ``@api_view`` function (above or
    below ``@api_view``; above also exempts it from ``ATOMIC_REQUESTS``), or an
    APIView / ViewSet method (``self, request, ...``). On DRF the claim is made inside
    the handler, after authentication, permissions and throttling have run. Async
    function views are supported; their database work runs in the view's transaction
    through Django's ``sync_to_async``.

    Keyword options (each defaults to the ``IDEMPOTENCY`` setting of the same name):
        required (bool): a missing key is a 400; ``False`` runs keyless requests
            unprotected.
        lease (float): seconds an in-flight claim holds off duplicates.
        retention (float): seconds the response is replayed (retention window).
        wait (float): seconds a duplicate waits for the original before a 409.
        replay_headers (list[str]): headers to replay although the exchange
            denylist drops them (``Server``, ``Via``, ...; docs/protocol.md#replay).
        fingerprint_exclude (list[str]): body fields left out of the fingerprint.
        fingerprint_headers (list[str]): request headers put into the fingerprint.
        principal (callable): ``request -> str | None``, who the key belongs to.
        endpoint (str): fixed endpoint name instead of ``"METHOD /route"``.
        release (callable): ``status -> bool``, release instead of store.
        phases (list[str]): the view's atomic phases in order; each
            ``request.idempotency.phase(name)`` block commits on its own and a retry
            resumes after the last finished one (docs/phases.md).
        using (str | callable): the database of the view's records, an alias or
            ``request -> alias`` (a tenant's shard); it must be the database the
            view writes to (docs/deployment.md).
        key (callable): ``request -> str | None``, the idempotency key taken from
            elsewhere in the request (a webhook's event id; docs/inbox.md).

    Raises:
        TypeError: an unknown or invalid option, or the decorator applied where it
            cannot protect the view: to a class-based view's ``as_view()`` or to a class
            (decorate its methods or use the mixin), above ``@staticmethod`` or
            ``@classmethod``, or to a view that is already ``@idempotent``.
    """
    opts = Options.from_kwargs(**options)

    def decorator(func: F) -> F:
        _refuse_unworkable(func)
        if _drf_view_class(func) is not None:
            return _wrap_api_view(func, decorator)  # type: ignore[no-any-return]
        DECORATED.add((func.__module__, func.__name__))
        view_name = f"{func.__module__}.{func.__qualname__}"
        if iscoroutinefunction(func):

            @wraps(func)
            async def _async_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = find_request(args)

                def call() -> Any:
                    return async_to_sync(func)(*args, **kwargs)

                finalize = make_finalizer(request, (), {})
                return await sync_to_async(run, thread_sensitive=True)(
                    request, opts, view_name, call, finalize
                )

            wrapper: Any = _async_wrapper
        else:

            @wraps(func)
            def _sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = find_request(args)
                view_args = args[args.index(request) + 1 :]
                return run(
                    request,
                    opts,
                    view_name,
                    lambda: func(*args, **kwargs),
                    make_finalizer(request, view_args, kwargs),
                )

            wrapper = _sync_wrapper
            # For @api_view above this decorator (DRF 3.17+ reads the attribute).

            wrapper.content_negotiation_class = function_negotiation(func)
        wrapper._idempotency_options = opts
        return mark_non_atomic(wrapper)  # type: ignore[no-any-return]

    if view is not None:
        return decorator(view)
    return decorator


def _codes() -> tuple[frozenset[Any], Any]:
    """The code objects of ``@idempotent``'s wrappers and of its inner decorator."""
    decorator_code = next(
        c for c in idempotent.__code__.co_consts if getattr(c, "co_name", "") == "decorator"
    )
    wrappers = frozenset(
        c
        for c in decorator_code.co_consts
        if getattr(c, "co_name", "") in ("_sync_wrapper", "_async_wrapper")
    )
    return wrappers, decorator_code


_WRAPPER_CODES, _DECORATOR_CODE = _codes()
