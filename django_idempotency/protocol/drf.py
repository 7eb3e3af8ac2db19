"""Django REST framework glue: ``IdempotentMixin`` and replay-aware content negotiation.

The only module importing DRF (besides ``openapi``, for drf-spectacular).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import BaseContentNegotiation, DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from django_idempotency.protocol.begin import SAFE_METHODS
from django_idempotency.protocol.handle import (
    NOT_ACCEPTABLE,
    atomic_requests_blocks,
    make_finalizer,
    mark_non_atomic,
    run,
)
from django_idempotency.protocol.keys import HEADER
from django_idempotency.protocol.options import Options


def closure_options(handler: Any) -> Options | None:
    """Options of an ``@idempotent`` function that DRF's ``@api_view`` closes over."""
    func = getattr(handler, "__func__", handler)
    for cell in getattr(func, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        options = getattr(contents, "_idempotency_options", None)
        if isinstance(options, Options):
            return options
    return None


def options_for(view: Any, method: str) -> Options | None:
    """The idempotency options protecting ``method`` of ``view``, or ``None``.

    The same precedence as at request time: a handler decorated with ``@idempotent``
    (above or below ``@api_view``) uses its own options; otherwise an
    ``IdempotentMixin`` view's ``idempotency_options_for(action)``.

    Args:
        view: a DRF view instance (``action`` set on ViewSets).
        method: the HTTP method (any case).
    """
    method = method.lower()
    if method.upper() in SAFE_METHODS:
        return None
    action = getattr(view, "action", None) or method
    handler = getattr(view, action, None) or getattr(view, method, None)
    if handler is None:
        return None
    options = getattr(handler, "_idempotency_options", None)
    if isinstance(options, Options):
        return options
    options = closure_options(handler)
    if options is None and hasattr(view, "idempotency_options_for"):
        options = view.idempotency_options_for(action)
    return options


def _may_replay(request: Request) -> bool:
    """Whether ``request`` is a keyed request to a protected handler (so may be a replay)."""
    if (request.method or "").upper() in SAFE_METHODS:
        return False
    view = (getattr(request, "parser_context", None) or {}).get("view")
    options = None if view is None else options_for(view, request.method or "")
    if options is None:
        return False
    # A receiver's key (key=) lies elsewhere in the request: it may be a redelivery.
    return options.key is not None or HEADER in request.headers


class ReplayNegotiationMixin:
    """Content negotiation that lets a replay through whatever the retry's ``Accept``.

    A replay is the stored representation (docs/faq.md): when no renderer satisfies
    the ``Accept`` of a keyed request to a protected handler, the ``NotAcceptable``
    is kept on the request instead of raised, so authentication, permissions and
    throttling still run and the app can answer from the record. If the view would
    have to run, the app raises the kept ``NotAcceptable`` then (406, nothing
    claimed), as DRF would have. Mix in before a content negotiation class.
    """

    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> Any:
        """The inner class's choice; on ``NotAcceptable``, the first renderer (deferred)."""
        candidates = list(renderers)
        try:
            return super().select_renderer(request, candidates, format_suffix)  # type: ignore[misc]
        except NotAcceptable as exc:
            if not candidates or not _may_replay(request):
                raise
            setattr(request, NOT_ACCEPTABLE, exc)
            return candidates[0], candidates[0].media_type


class ReplayNegotiation(ReplayNegotiationMixin, DefaultContentNegotiation):
    """DRF's default negotiation, replay-aware.

    ``IdempotentMixin`` views and ``@idempotent`` function views get replay-aware
    negotiation on their own; set ``REST_FRAMEWORK["DEFAULT_CONTENT_NEGOTIATION_CLASS"]``
    to this class only for ``@idempotent`` below ``@api_view`` on DRF before 3.17
    (whose ``@api_view`` ignores a function's ``content_negotiation_class``).
    """


_REPLAY_CLASSES: dict[type[BaseContentNegotiation], type[BaseContentNegotiation]] = {}


def replay_negotiation(negotiation: type[BaseContentNegotiation]) -> type[BaseContentNegotiation]:
    """``negotiation`` made replay-aware (itself if it already is).

    Args:
        negotiation: a DRF content negotiation class (``select_renderer`` raises
            ``NotAcceptable`` when no renderer fits).
    """
    if issubclass(negotiation, ReplayNegotiationMixin):
        return negotiation
    made = _REPLAY_CLASSES.get(negotiation)
    if made is None:
        made = type(
            f"Replay{negotiation.__name__}",
            (ReplayNegotiationMixin, negotiation),
            {"__module__": __name__, "__doc__": ReplayNegotiationMixin.__doc__},
        )
        made = _REPLAY_CLASSES.setdefault(negotiation, made)
    return made


def function_negotiation(func: Any) -> type[BaseContentNegotiation]:
    """The replay-aware negotiation class ``@api_view`` should give ``func``'s view."""
    from rest_framework.views import APIView

    chosen: type[BaseContentNegotiation] = (
        getattr(func, "content_negotiation_class", None) or APIView.content_negotiation_class
    )
    return replay_negotiation(chosen)


def passes_the_call_on(method: Any) -> bool:
    """Whether ``method`` (a function, classmethod or staticmethod) calls ``super()``.

    Read from its code (the name ``super`` among the names it uses), through
    ``functools.wraps`` decorators to the function they wrap. A callable whose code
    cannot be read is taken to pass the call on.
    """
    func = inspect.unwrap(getattr(method, "__func__", method))
    code = getattr(func, "__code__", None)
    return code is None or "super" in code.co_names


def overridden_methods() -> tuple[str, ...]:
    """The methods of DRF's views that :class:`IdempotentMixin` overrides (``initial``...)."""
    from rest_framework.views import APIView

    return tuple(
        name
        for name, value in vars(IdempotentMixin).items()
        if not name.startswith("_")
        and callable(getattr(value, "__func__", value))
        and hasattr(APIView, name)
    )


def shadowing(cls: type) -> list[tuple[str, type]]:
    """(method, class) for each method of the mixin that ``cls`` never reaches.

    A class before ``IdempotentMixin`` in ``cls.__mro__`` that defines one of the
    :func:`overridden_methods` without passing the call on (``super()``) shadows the
    mixin's: DRF's ``APIView.initial`` when the mixin comes after the view class in the
    bases, or a subclass's ``initial`` that does not call ``super().initial()``.

    Args:
        cls: a class; without ``IdempotentMixin`` among its bases, nothing is found.
    """
    mro = cls.__mro__
    if IdempotentMixin not in mro:
        return []
    before = mro[: mro.index(IdempotentMixin)]
    found = []
    for name in overridden_methods():
        for klass in before:
            if name in vars(klass) and not passes_the_call_on(vars(klass)[name]):
                found.append((name, klass))
                break
    return found


def _refuse_misplaced_mixin(cls: type) -> None:
    """``TypeError`` when ``cls`` cannot run :class:`IdempotentMixin`'s methods.

    The bases are checked where the mistake is certain: a class that is not itself
    built on the mixin (DRF's ``APIView``, a ViewSet, another mixin) comes before it in
    the MRO and defines one of its methods without passing the call on, so no request
    would be protected; or the mixin is on a view that is not DRF's (Django's ``View``
    never calls ``initial``). A subclass of a correctly built view that overrides one of
    these methods without ``super()`` is reported by the system check E010 instead (its
    code is read, which a decorator can hide).
    """
    from django.views import View
    from rest_framework.views import APIView

    if issubclass(cls, View) and not issubclass(cls, APIView):
        raise TypeError(
            f"IdempotentMixin protects Django REST framework views (APIView, ViewSet), "
            f"and {cls.__qualname__} is a Django class-based view, which never calls the "
            "mixin's initial(): no request would be protected. Decorate its handlers "
            "instead (@idempotent on post, or "
            '@method_decorator(idempotent, name="post") on the class).'
        )
    outside = [(name, k) for name, k in shadowing(cls) if not issubclass(k, IdempotentMixin)]
    if not outside:
        return
    methods = ", ".join(f"{k.__qualname__}.{name}()" for name, k in outside)
    bases = [b for b in cls.__bases__ if not issubclass(b, IdempotentMixin)]
    carrier = [b for b in cls.__bases__ if issubclass(b, IdempotentMixin)]
    fixed = ", ".join(b.__name__ for b in (carrier or [IdempotentMixin]) + bases)
    raise TypeError(
        f"{cls.__name__} lists IdempotentMixin after a base whose {methods} do not "
        "call super(): the mixin's never run, so no request would be protected (a POST "
        "without a key would run, a retry would run again). Put the mixin first in the "
        f"bases: class {cls.__name__}({fixed})."
    )


class IdempotentMixin:
    """Protect an APIView's or ViewSet's unsafe actions with ``Idempotency-Key``.

    Put it before the view class in the bases (``class WorkerViewSet(IdempotentMixin,
    viewsets.ModelViewSet)``); anywhere else ``TypeError`` is raised when the class is
    defined. The claim is made in ``initial()``, after DRF has run authentication,
    permissions and throttling, so a replay never bypasses them.

    Attributes:
        idempotent_actions: which actions are protected. ``None`` (default): every
            handler of an unsafe method (POST, PUT, PATCH, DELETE). Otherwise an
            iterable of action names (ViewSet: ``"create"``, ``"reboot"``; APIView:
            ``"post"``), or a mapping of action name to per-action options, e.g.
            ``{"create": {"retention": 7 * 86400}, "reboot": {}}``.
        idempotency_options: options for every protected action of the view (the
            keyword options of ``@idempotent``).
        idempotency_exempt_actions: action names deliberately left unprotected: they
            run without a claim, a key or not (a mutating action that is neither
            protected nor exempt is reported by the system check W011). With
            ``idempotent_actions = None``, these are taken out of "every unsafe
            handler".

    Handlers already decorated with ``@idempotent`` keep their own options.
    """

    idempotent_actions: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None
    idempotency_options: Mapping[str, Any] = {}
    idempotency_exempt_actions: Iterable[str] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Validate the options when the class is defined, as ``@idempotent`` does.

        Raises:
            TypeError: an unknown option or an invalid value (a misspelt option would
                otherwise fail on every request); the mixin after the view class in the
                bases, or on a Django (not DRF) class-based view: its methods would
                never run and no request would be protected; ``idempotent_actions`` or
                ``idempotency_exempt_actions`` a string, or an action in both.
        """
        super().__init_subclass__(**kwargs)
        _refuse_misplaced_mixin(cls)
        Options.from_kwargs(**dict(cls.idempotency_options))
        actions = cls.idempotent_actions
        for name, value in (
            ("idempotent_actions", actions),
            ("idempotency_exempt_actions", cls.idempotency_exempt_actions),
        ):
            if isinstance(value, str):
                raise TypeError(f"{cls.__qualname__}.{name} must be a list, not a string")
        if isinstance(actions, Mapping):
            for options in actions.values():
                Options.from_kwargs(**dict(options))
        both = sorted(set(actions or ()) & set(cls.idempotency_exempt_actions))
        if both:
            raise TypeError(
                f"{cls.__qualname__} both protects and exempts {', '.join(map(repr, both))}: "
                "list each action in idempotent_actions or in idempotency_exempt_actions."
            )

    def get_content_negotiator(self) -> BaseContentNegotiation:
        """The view's negotiation, replay-aware (:class:`ReplayNegotiationMixin`)."""
        if not getattr(self, "_negotiator", None):
            negotiation = replay_negotiation(self.content_negotiation_class)  # type: ignore[attr-defined]
            self._negotiator = negotiation()
        return self._negotiator

    @classmethod
    def as_view(cls, *args: Any, **kwargs: Any) -> Any:
        """DRF's ``as_view``, exempted from ``ATOMIC_REQUESTS`` (we open the blocks)."""
        return mark_non_atomic(super().as_view(*args, **kwargs))  # type: ignore[misc]

    def idempotency_options_for(self, action: str) -> Options | None:
        """The options protecting ``action``, or ``None`` when it is not protected.

        Built once per class and action (the attributes are class-level; the settings
        behind unset options are still read at request time by ``Options``).
        """
        cache: dict[str, Options | None] = type(self).__dict__.get("_idempotency_cache", {})
        if action not in cache:
            cache[action] = self._build_options(action)
            type(self)._idempotency_cache = cache  # type: ignore[attr-defined]
        return cache[action]

    def _build_options(self, action: str) -> Options | None:
        if action in self.idempotency_exempt_actions:
            return None
        base = Options.from_kwargs(**dict(self.idempotency_options))
        actions = self.idempotent_actions
        if actions is None:
            return base
        if isinstance(actions, Mapping):
            if action not in actions:
                return None
            return base.merged(Options.from_kwargs(**dict(actions[action])))
        return base if action in actions else None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """Run DRF's checks, then route the handler through the idempotency protocol."""
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        method = (request.method or "").lower()
        handler = getattr(self, method, None)
        if handler is None or hasattr(handler, "_idempotency_options"):
            return  # not allowed, or decorated with @idempotent: it handles itself
        action = getattr(self, "action", None) or method
        options = None
        if method.upper() not in SAFE_METHODS:
            options = self.idempotency_options_for(action)
        view_name = f"{type(self).__module__}.{type(self).__qualname__}.{action}"

        def idempotent_handler(request: Request, *args: Any, **kwargs: Any) -> Any:
            def call() -> Any:
                return handler(request, *args, **kwargs)

            if options is None:
                with atomic_requests_blocks():
                    return call()
            finalize = make_finalizer(request, args, kwargs)
            return run(request, options, view_name, call, finalize)

        setattr(self, method, idempotent_handler)
