"""``@idempotent(...)`` for function views and view methods, sync and async."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async

from .glue import find_request, make_finalizer, mark_non_atomic, run
from .options import Options

F = TypeVar("F", bound=Callable[..., Any])


def _check_target(func: Callable[..., Any]) -> None:
    view_class = getattr(func, "view_class", None) or getattr(func, "cls", None)
    if view_class is not None and hasattr(view_class, "finalize_response"):
        raise TypeError(
            f"@idempotent was applied to the DRF view {func.__name__!r} as a whole, so "
            "it would run before authentication and permissions. Put @idempotent "
            "below @api_view, on the APIView's method, or use IdempotentMixin."
        )


@overload
def idempotent(view: F, /) -> F: ...
@overload
def idempotent(view: None = None, /, **options: Any) -> Callable[[F], F]: ...


def idempotent(view: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Make a view honour the ``Idempotency-Key`` header (SPEC §2-§4).

    Use bare (``@idempotent``) or with options (``@idempotent(retention=7 * 86400)``)
    on a function view (``request, ...``), a DRF ``@api_view`` function (place it
    *below* ``@api_view``), or an APIView / ViewSet method (``self, request, ...``).
    On DRF the claim is made inside the handler, after authentication, permissions
    and throttling have run. Async function views are supported; their database work
    runs in the view's transaction through Django's ``sync_to_async``.

    Keyword options (each defaults to the ``IDEMPOTENCY`` setting of the same name):
        required (bool): a missing key is a 400; ``False`` runs keyless requests
            unprotected.
        lease (float): seconds an in-flight claim holds off duplicates.
        retention (float): seconds the response is replayed (retention window).
        wait (float): seconds a duplicate waits for the original before a 409.
        replay_headers (list[str]): extra response headers to store and replay.
        fingerprint_exclude (list[str]): body fields left out of the fingerprint.
        fingerprint_headers (list[str]): request headers put into the fingerprint.
        principal (callable): ``request -> str | None``, who the key belongs to.
        endpoint (str): fixed endpoint name instead of ``"METHOD /route"``.
        release (callable): ``status -> bool``, release instead of store.

    Raises:
        TypeError: an unknown or invalid option, or the decorator placed above
            ``@api_view`` / on ``APIView.as_view()``.
    """
    opts = Options.from_kwargs(**options)

    def decorator(func: F) -> F:
        _check_target(func)
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
        wrapper._idempotency_options = opts
        return mark_non_atomic(wrapper)  # type: ignore[no-any-return]

    if view is not None:
        return decorator(view)
    return decorator
