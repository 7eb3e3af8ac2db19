"""Django Ninja: ``pip install django-idempotency[ninja]`` (docs/ninja.md).

:func:`idempotent` protects a Ninja operation, sync or async::

    from django_idempotency.contrib.ninja import idempotent

    @router.post("/workers/{worker_id}/reboot", response={201: RebootOut})
    @idempotent(retention=7 * 86400)
    def reboot(request, worker_id: int, payload: RebootIn): ...

The operation runs in Ninja's order: authentication (``auth=`` of the operation, router
or API) and throttling, then the parameters and the body are parsed and validated, then
the key is claimed and the operation runs. What it returns (a dict, a ``Schema``, a
``Status``, an ``HttpResponse``) is rendered through the API's renderer and the
response models, as Ninja would, and those bytes are stored; a retry gets them back
byte for byte with ``Idempotent-Replayed: true``. The principal is the user
``request.auth`` stands for (:func:`auth_principal`; ``principal=`` chooses another,
:func:`credential_principal` the credential itself), the endpoint from the operation's
route (``"POST /api/workers/{worker_id}/reboot"``), the fingerprint from the body (for
a PUT or PATCH with files, from what ``fix_request_files_middleware`` parsed). The
operation's OpenAPI schema (``api.get_openapi_schema()``) declares the
``Idempotency-Key`` header, the ``400``/``409``/``422`` problem responses (Ninja's
validation error beside the ``422``) and the ``x-idempotency`` key policy
(``contrib.ninja_openapi``). The system checks list protected operations with the
other protected endpoints (``protocol.endpoints``). With ``ATOMIC_REQUESTS``, mount the API with
:func:`api_urls` so that protected operations claim outside the request's transaction.

This module (and ``ninja_openapi``) imports ``ninja``; nothing else in the app imports
them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from functools import partial, wraps
from inspect import iscoroutinefunction
from types import MethodType
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async
from django.http.response import HttpResponseBase
from ninja import NinjaAPI
from ninja.operation import Operation, PathView
from ninja.utils import contribute_operation_callback

from django_idempotency.contrib.ninja_openapi import openapi_extra
from django_idempotency.principals import auth_token_principal
from django_idempotency.protocol import endpoints
from django_idempotency.protocol.begin import SAFE_METHODS
from django_idempotency.protocol.handle import (
    atomic_requests_blocks,
    make_finalizer,
    mark_non_atomic,
    run,
)
from django_idempotency.protocol.options import Options

__all__ = [
    "api_urls",
    "auth_principal",
    "credential_principal",
    "idempotent",
    "options_for",
]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_idempotency")

#: Attribute of a protected operation function: its :class:`Options`.
_OPTIONS = "_idempotency_ninja_options"

#: Attribute of a request: the Ninja operation serving it (set before Ninja's checks).
_OPERATION = "_idempotency_ninja_operation"

#: Attribute of an operation whose ``run`` :func:`api_urls` put in ``ATOMIC_REQUESTS``.
_IN_ATOMIC_REQUESTS = "_idempotency_in_atomic_requests"


def _user_label(user: Any) -> str | None:
    """``"<app_label>.<model>:<pk>"`` of an authenticated user model instance, else ``None``."""
    meta = getattr(user, "_meta", None)
    if meta is None or getattr(user, "pk", None) is None:
        return None
    if getattr(user, "is_authenticated", False) is not True:
        return None
    return f"{meta.label_lower}:{user.pk}"


def auth_principal(request: Any) -> str | None:
    """The principal of a Ninja request: the user its credential stands for.

    Ninja sets ``request.auth`` to what the operation's authentication returned. The
    principal is ``"<app_label>.<model>:<pk>"`` of, in this order: ``request.auth``
    when it is a user (a model instance whose ``is_authenticated`` is true);
    ``request.auth.user`` when it is a credential row of a user (DRF's ``Token``, an
    OAuth access token); Django's ``request.user`` when it is authenticated. So a
    client whose access token is refreshed keeps its keys: the same key with the new
    token replays. A credential that names no user (a bare string, bytes or integer
    token, a JWT, an API key row without ``user``) gives ``None``: the keyed request is
    refused (``403 no-principal``), nothing claimed, and a warning is logged once per
    operation on the ``django_idempotency`` logger. Return the user from
    ``authenticate()``, or pass ``principal=`` to :func:`idempotent` (a resolver of
    your own, or :func:`credential_principal`, which keys on the credential itself).

    Args:
        request: the Django ``HttpRequest`` Ninja serves.
    """
    auth = getattr(request, "auth", None)
    for candidate in (auth, getattr(auth, "user", None), getattr(request, "user", None)):
        principal = _user_label(candidate)
        if principal is not None:
            return principal
    if auth is not None and not isinstance(auth, bool):
        _warn_credential_without_user(request, auth)
    return None


def credential_principal(request: Any) -> str | None:
    """The principal of a Ninja request: its credential itself, never stored.

    A string, bytes or integer credential (a token, a JWT, an API key) is named by its
    SHA-256 (``"credential:<hex>"``), a credential row by its model label and the
    SHA-256 of its primary key
    (:func:`~django_idempotency.principals.auth_token_principal`). Pass it as
    ``@idempotent(principal=credential_principal)`` for credentials that are the
    client's identity and never change (a long-lived API key of a service account).
    Keys are then scoped by the credential: after a token is refreshed or rotated, the
    same key is another principal's, and the operation runs again. Returns ``None``
    (refused) without a credential.

    Args:
        request: the Django ``HttpRequest`` Ninja serves.
    """
    auth = getattr(request, "auth", None)
    if auth is None or isinstance(auth, bool):
        return None
    return auth_token_principal(request)


#: Operations whose credential without a user was logged (once each per process).
_WARNED: set[str] = set()


def _warn_credential_without_user(request: Any, auth: Any) -> None:
    operation = getattr(request, _OPERATION, None)
    view = getattr(operation, "view_func", None)
    name = f"{getattr(view, '__module__', '')}.{getattr(view, '__qualname__', '?')}"
    if name in _WARNED:
        return
    _WARNED.add(name)
    logger.warning(
        "%s: request.auth is a %s that names no user, so keyed requests are refused "
        "(403 no-principal). Return the user the credential stands for from "
        "authenticate(), or pass principal= to @idempotent (credential_principal keys "
        "on the credential itself: a refreshed token is then another principal).",
        name,
        type(auth).__name__,
        extra={"operation": name},
    )


def options_for(operation: Operation) -> Options | None:
    """The idempotency options protecting a Ninja ``operation``, or ``None``."""
    options = getattr(operation.view_func, _OPTIONS, None)
    return options if isinstance(options, Options) else None


def _protected_operations(callback: Any) -> Iterator[tuple[Any, Options]]:
    """(operation function, options) of each protected operation a URL view serves.

    Ninja's URL view for a path closes over its ``PathView``, whose ``operations``
    answer the path's methods. Registered with ``protocol.endpoints`` so that the
    system checks list Ninja's operations beside the other protected endpoints.
    """
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, PathView):
            for operation in value.operations:
                options = options_for(operation)
                if options is not None:
                    yield operation.view_func, options


endpoints.register("ninja", _protected_operations)


@overload
def idempotent(view: F, /) -> F: ...
@overload
def idempotent(view: None = None, /, **options: Any) -> Callable[[F], F]: ...


def idempotent(view: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Make a Ninja operation honour the ``Idempotency-Key`` header.

    Put it below the operation decorator (``@router.post(...)``, ``@api.put(...)``),
    bare or with the keyword options of ``django_idempotency.idempotent``
    (``required``, ``lease``, ``retention``, ``wait``, ``phases``, ``using``,
    ``principal``, ``key``, ...). ``principal`` defaults to :func:`auth_principal`
    (``request.auth``); the ``PRINCIPAL_RESOLVER`` setting does not apply here.

    Raises:
        TypeError: an unknown or invalid option; the function is already protected; the
            operation is a streaming one (``response=...`` of a stream: its chunks are
            sent as they are made, so there is no response to store); or it answers
            only safe methods (GET, HEAD, OPTIONS), which are never recorded.
    """
    opts = Options.from_kwargs(**options)
    if opts.principal is None:
        opts = dataclasses.replace(opts, principal=auth_principal)

    def decorator(func: F) -> F:
        if hasattr(func, _OPTIONS):
            raise TypeError(
                f"{func.__qualname__} is already @idempotent: a second one would claim "
                "every key twice. Keep one."
            )
        setattr(func, _OPTIONS, opts)
        operation = getattr(func, "_ninja_operation", None)
        if isinstance(operation, Operation):  # above @router.post(...)
            _install(opts, operation)
        else:  # below it: Ninja calls back when it builds the operation
            contribute_operation_callback(func, partial(_install, opts))
        return func

    if view is not None:
        return decorator(view)
    return decorator


def api_urls(api: NinjaAPI) -> tuple[list[Any], str, str]:
    """``api.urls``, for a project with ``ATOMIC_REQUESTS``, protected operations exempted.

    Mount it as ``path("api/", api_urls(api))``. Django wraps the URL view Ninja makes
    for each path in the request's transaction, so a protected operation would claim
    its key inside it (a duplicate would wait instead of getting a 409). The views
    returned here are exempted from
    ``ATOMIC_REQUESTS``; each unprotected sync operation of the API runs in the
    ``ATOMIC_REQUESTS`` blocks itself instead (its authentication included, as Django
    would), and each protected operation claims first, then runs in its own
    transaction. Unprotected async operations run without a request transaction
    (Django refuses ``ATOMIC_REQUESTS`` for async views). Without ``ATOMIC_REQUESTS``,
    ``api.urls`` is enough.

    Args:
        api: the ``NinjaAPI``, with all its routers added.

    Returns:
        What ``api.urls`` returns: ``(patterns, app_name, namespace)``, for ``path()``.
    """
    patterns, app_name, namespace = api.urls
    for bound_router in api._get_bound_routers():
        for path_view in bound_router.path_operations.values():
            for operation in path_view.operations:
                protected = options_for(operation) is not None
                if protected or operation.is_async or hasattr(operation, _IN_ATOMIC_REQUESTS):
                    continue
                operation.run = _in_atomic_requests(operation.run)  # type: ignore[method-assign]
                setattr(operation, _IN_ATOMIC_REQUESTS, True)
    for pattern in patterns:
        callback = getattr(pattern, "callback", None)
        if callback is not None:
            mark_non_atomic(callback)
    return patterns, app_name, namespace


def _in_atomic_requests(operation_run: Callable[..., Any]) -> Callable[..., Any]:
    """``operation_run`` inside the ``ATOMIC_REQUESTS`` blocks its URL view no longer gets."""

    @wraps(operation_run)
    def atomic_run(request: Any, *args: Any, **kwargs: Any) -> Any:
        with atomic_requests_blocks():
            return operation_run(request, *args, **kwargs)

    return atomic_run


def _install(options: Options, operation: Operation) -> None:
    """Protect ``operation`` (and every copy Ninja makes of it when a router is mounted)."""
    name = getattr(operation.view_func, "__qualname__", repr(operation.view_func))
    if getattr(operation, "stream_format", None) is not None:
        raise TypeError(
            f"@idempotent cannot protect the streaming operation {name}: its response "
            "is sent as it is produced, so there is nothing to store and replay."
        )
    if all(method.upper() in SAFE_METHODS for method in operation.methods):
        raise TypeError(
            f"@idempotent on {name}, which answers only {', '.join(operation.methods)}: "
            "safe methods are never recorded. Protect POST, PUT, PATCH or DELETE."
        )
    view = operation.view_func
    wrapper = _protect(view, options, f"{view.__module__}.{view.__qualname__}")
    setattr(wrapper, _OPTIONS, options)
    operation.view_func = wrapper
    # Ninja copies each operation when a router is bound to an API, then applies
    # ``_run_decorators`` to the copy's ``run``: ours first, so it is the copy's own.
    decorators = [_remember_operation, *getattr(operation, "_run_decorators", [])]
    operation._run_decorators = decorators  # type: ignore[attr-defined]
    bound: Any = MethodType(type(operation).run, operation)
    for decorate in decorators:
        bound = decorate(bound)
    operation.run = bound  # type: ignore[method-assign]
    operation.openapi_extra = openapi_extra(options, operation)


def _remember_operation(operation_run: Any) -> Any:
    """``operation.run`` that first notes the operation on the request."""
    operation = getattr(operation_run, "__self__", None)
    if not isinstance(operation, Operation):
        raise TypeError(
            "django_idempotency.contrib.ninja could not find the operation it protects: "
            "a run decorator was applied before it."
        )

    @wraps(operation_run)
    def remembering(request: Any, *args: Any, **kwargs: Any) -> Any:
        setattr(request, _OPERATION, operation)
        return operation_run(request, *args, **kwargs)

    return remembering


def _render(request: Any, result: Any, values: dict[str, Any]) -> HttpResponseBase:
    """``result`` of the operation as the ``HttpResponse`` Ninja would send.

    Raises:
        RuntimeError: the request was not served by a Ninja operation.
    """
    operation: Operation | None = getattr(request, _OPERATION, None)
    if operation is None:
        raise RuntimeError("a django_idempotency.contrib.ninja operation was called outside Ninja")
    response_arg = operation.signature.response_arg
    temporal = values.get(response_arg) if response_arg else None
    if temporal is None:
        temporal = operation.api.create_temporal_response(request)
    return operation._result_to_response(request, result, temporal)


def _protect(view: Callable[..., Any], options: Options, view_name: str) -> Callable[..., Any]:
    """``view`` (Ninja's operation function) run under the idempotency protocol."""
    if iscoroutinefunction(view):

        @wraps(view)
        async def _async_operation(request: Any, *args: Any, **values: Any) -> Any:
            def call() -> HttpResponseBase:
                result = async_to_sync(view)(request, *args, **values)
                return _render(request, result, values)

            finalize = make_finalizer(request, (), {})
            return await sync_to_async(run, thread_sensitive=True)(
                request, options, view_name, call, finalize
            )

        return _async_operation

    @wraps(view)
    def _sync_operation(request: Any, *args: Any, **values: Any) -> Any:
        def call() -> HttpResponseBase:
            return _render(request, view(request, *args, **values), values)

        return run(request, options, view_name, call, make_finalizer(request, (), {}))

    return _sync_operation
