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
from django_idempotency.contrib.openapi_parts import (
    EXTENSION,
    PROBLEM_COMPONENT,
    PROBLEM_RESPONSES,
    PROBLEM_SCHEMA,
    duration,
    header_description,
    policy,
)
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
                description=header_description(options),
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
        for code, description in PROBLEM_RESPONSES.items():
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
            schema=PROBLEM_SCHEMA,
        )
        self.registry.register_on_missing(component)
        ref: dict[str, str] = component.ref
        return ref


class IdempotentAutoSchema(IdempotentSchemaMixin, AutoSchema):
    """drf-spectacular's ``AutoSchema`` with the idempotency additions.

    Use as ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``, or per view as
    ``schema = IdempotentAutoSchema()``.
    """
