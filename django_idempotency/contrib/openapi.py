"""OpenAPI for drf-spectacular: ``pip install django-idempotency[openapi]``.

Set the schema class, and every idempotent operation declares the ``Idempotency-Key``
request header (required or optional, as the view is) with the operation's retention
window and lease in its description and in the ``x-idempotency`` extension, its
``400``/``409``/``422`` ``application/problem+json`` responses, ``Retry-After`` on the
409 and ``Idempotent-Replayed`` on success responses::

    REST_FRAMEWORK = {
        "DEFAULT_SCHEMA_CLASS": "django_idempotency.contrib.openapi.IdempotentAutoSchema",
    }

Projects with their own ``AutoSchema`` subclass mix :class:`IdempotentSchemaMixin` in
before it. Operations are found protected by the ``_idempotency_options`` that
``@idempotent`` leaves on handlers, and by ``IdempotentMixin.idempotency_options_for``
(docs/openapi.md). This module imports ``drf_spectacular``; nothing else in the app
imports this module.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiParameter

from django_idempotency.conf import conf
from django_idempotency.protocol import problems
from django_idempotency.protocol.drf import options_for
from django_idempotency.protocol.keys import HEADER
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.responses import REPLAYED_HEADER

__all__ = [
    "EXTENSION",
    "IdempotentAutoSchema",
    "IdempotentSchemaMixin",
    "duration",
    "options_for",
    "policy",
]

#: Name of the problem+json schema component.
PROBLEM_COMPONENT = "IdempotencyProblem"

_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem detail produced by django-idempotency.",
    "properties": {
        "type": {"type": "string", "format": "uri", "description": "Stable problem type URI."},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What happened and what to do."},
    },
    "required": ["type", "title", "status", "detail"],
}

_RESPONSES = {
    "400": "The Idempotency-Key header is missing (on an endpoint that requires it) or "
    "invalid, or the request body could not be read. Nothing was done.",
    "409": "A request with this Idempotency-Key is still in flight, or this request "
    "lost its claim. Retry after Retry-After seconds with the same key.",
    "422": "This Idempotency-Key was already used with a different request.",
}


#: Name of the operation extension that publishes the key policy (docs/openapi.md).
EXTENSION = "x-idempotency"

#: (seconds, unit, smallest count written in that unit): one day reads "24 hours".
_UNITS = ((86400, "day", 2), (3600, "hour", 1), (60, "minute", 1))


def duration(seconds: float) -> str:
    """``seconds`` in words: ``"24 hours"``, ``"7 days"``, ``"90 seconds"``.

    The largest unit (days from 2 days on, hours, minutes) that divides ``seconds``
    exactly, else seconds.
    """
    for size, unit, smallest in _UNITS:
        if seconds >= size * smallest and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    count_text = f"{seconds:g}"
    return f"{count_text} second{'' if count_text == '1' else 's'}"


def policy(options: Options) -> dict[str, Any]:
    """The key policy of an operation protected by ``options``, as published.

    ``retentionSeconds``: how long a key is remembered after its first use (a retry
    within it replays the first response; after it, the key is new).
    ``leaseSeconds``: how long an unfinished request holds its key (duplicates get 409)
    before a retry may take it over. ``required``: whether a request needs a key.
    ``header``: ``Idempotency-Key``, or ``null`` when the view takes its key from
    elsewhere in the request (``key=``, a webhook's event id: docs/inbox.md).
    """
    return {
        "header": HEADER if options.key is None else None,
        "required": options.get_required(),
        "retentionSeconds": options.get_retention(),
        "leaseSeconds": options.get_lease(),
    }


class IdempotentSchemaMixin:
    """Adds the ``Idempotency-Key`` header and problem responses to protected operations.

    Mix into an ``drf_spectacular.openapi.AutoSchema`` subclass, before it.
    """

    view: Any
    method: str
    registry: Any

    def idempotency_options(self) -> Options | None:
        """The options of the operation being generated, ``None`` if unprotected."""
        return options_for(self.view, self.method)

    def get_override_parameters(self) -> list[Any]:
        """The view's parameters plus ``Idempotency-Key`` on a protected operation."""
        parameters: list[Any] = list(super().get_override_parameters())  # type: ignore[misc]
        options = self.idempotency_options()
        if options is None or options.key is not None:  # key= reads its own field
            return parameters
        required = options.get_required()
        parameters.insert(
            0,
            OpenApiParameter(
                HEADER,
                type={"type": "string", "minLength": 1, "maxLength": conf.max_key_length},
                location=OpenApiParameter.HEADER,
                required=required,
                description=(
                    "A unique key per operation (a UUID); send the same key on every "
                    "retry. A retry replays the first response instead of running again."
                    + ("" if required else " Optional: without it the request is not protected.")
                    + f" Retention window: {duration(options.get_retention())} after the "
                    "first request; a retry within it gets the first response, after it "
                    "the key is new."
                    + f" Lease: {duration(options.get_lease())}; while the first request "
                    "runs, a retry gets 409 with Retry-After, and a request that stopped "
                    "without an answer is taken over by a retry once its lease is over."
                ),
            ),
        )
        return parameters

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """The operation, with the idempotency responses added when it is protected."""
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)  # type: ignore[misc]
        options = self.idempotency_options()
        if operation is None or options is None:
            return operation
        operation.setdefault(EXTENSION, policy(options))
        responses = operation.setdefault("responses", {})
        for code, response in responses.items():
            if str(code).startswith("2"):
                headers = response.setdefault("headers", {})
                headers.setdefault(
                    REPLAYED_HEADER,
                    {
                        "schema": {"type": "string", "enum": ["true"]},
                        "description": "Present when this is a replay of the stored response.",
                    },
                )
        problem = {"schema": self._problem_ref()}
        for code, description in _RESPONSES.items():
            response = responses.setdefault(code, {"description": description})
            response.setdefault("content", {}).setdefault(problems.CONTENT_TYPE, problem)
            if code == "409":
                response.setdefault("headers", {})["Retry-After"] = {
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "Seconds to wait before retrying with the same key.",
                }
        return operation

    def _problem_ref(self) -> dict[str, str]:
        component = ResolvedComponent(  # type: ignore[no-untyped-call]  # untyped __init__
            name=PROBLEM_COMPONENT,
            type=ResolvedComponent.SCHEMA,
            object=PROBLEM_COMPONENT,
            schema=_PROBLEM_SCHEMA,
        )
        self.registry.register_on_missing(component)
        ref: dict[str, str] = component.ref
        return ref


class IdempotentAutoSchema(IdempotentSchemaMixin, AutoSchema):
    """drf-spectacular's ``AutoSchema`` with the idempotency additions.

    Use as ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``, or per view as
    ``schema = IdempotentAutoSchema()``.
    """
