"""Django REST framework glue: ``IdempotentMixin``. The only module importing DRF."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rest_framework.request import Request

from .glue import atomic_requests_blocks, make_finalizer, mark_non_atomic, run
from .options import Options
from .protocol import SAFE_METHODS


class IdempotentMixin:
    """Protect an APIView's or ViewSet's unsafe actions with ``Idempotency-Key``.

    Put it before the view class in the bases (``class WorkerViewSet(IdempotentMixin,
    viewsets.ModelViewSet)``). The claim is made in ``initial()``, after DRF has run
    authentication, permissions and throttling, so a replay never bypasses them.

    Attributes:
        idempotent_actions: which actions are protected. ``None`` (default): every
            handler of an unsafe method (POST, PUT, PATCH, DELETE). Otherwise an
            iterable of action names (ViewSet: ``"create"``, ``"reboot"``; APIView:
            ``"post"``), or a mapping of action name to per-action options, e.g.
            ``{"create": {"retention": 7 * 86400}, "reboot": {}}``.
        idempotency_options: options for every protected action of the view (the
            keyword options of ``@idempotent``).

    Handlers already decorated with ``@idempotent`` keep their own options.
    """

    idempotent_actions: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None
    idempotency_options: Mapping[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Validate the options when the class is defined, as ``@idempotent`` does.

        Raises:
            TypeError: an unknown option or an invalid value (a misspelt option would
                otherwise fail on every request).
        """
        super().__init_subclass__(**kwargs)
        Options.from_kwargs(**dict(cls.idempotency_options))
        actions = cls.idempotent_actions
        if isinstance(actions, str):
            raise TypeError(f"{cls.__qualname__}.idempotent_actions must be a list, not a string")
        if isinstance(actions, Mapping):
            for options in actions.values():
                Options.from_kwargs(**dict(options))

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
