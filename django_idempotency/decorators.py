"""``@idempotent(...)`` for function views and view methods, sync and async."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async

from .glue import atomic_requests_blocks, find_request, make_finalizer, mark_non_atomic, run
from .options import Options
from .protocol import SAFE_METHODS

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
    from .drf import replay_negotiation

    view_class = view.cls
    if "WrappedAPIView" not in view_class.__qualname__:
        raise TypeError(
            f"@idempotent cannot wrap the class-based view {view_class.__name__!r} from "
            "outside: it would run before authentication and permissions. Decorate its "
            "methods, or add IdempotentMixin to the class."
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
        TypeError: an unknown or invalid option, or the decorator applied to a
            class-based view's ``as_view()`` (decorate its methods or use the mixin).
    """
    opts = Options.from_kwargs(**options)

    def decorator(func: F) -> F:
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
            from .drf import function_negotiation

            wrapper.content_negotiation_class = function_negotiation(func)
        wrapper._idempotency_options = opts
        return mark_non_atomic(wrapper)  # type: ignore[no-any-return]

    if view is not None:
        return decorator(view)
    return decorator
