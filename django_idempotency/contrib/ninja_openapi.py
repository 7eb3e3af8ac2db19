"""The OpenAPI description of a protected Django Ninja operation (docs/ninja.md).

Imported by ``contrib.ninja`` only; it imports ``ninja``.
"""

from __future__ import annotations

from typing import Any

from ninja.operation import Operation

from django_idempotency.conf import conf
from django_idempotency.contrib.openapi_parts import (
    EXTENSION,
    PROBLEM_RESPONSES,
    PROBLEM_SCHEMA,
    header_description,
    policy,
)
from django_idempotency.protocol import problems
from django_idempotency.protocol.keys import HEADER
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.responses import REPLAYED_HEADER

_JSON = "application/json"

#: Ninja's own answer to an invalid request (its default ``ValidationError`` handler):
#: ``422`` with ``{"detail": [<one object per error: type, loc, msg...>]}``.
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"detail": {"type": "array", "items": {"type": "object"}}},
    "required": ["detail"],
}

_VALIDATION_DESCRIPTION = (
    "Or (application/json) a parameter or the body is invalid: Ninja's validation "
    "error, answered before the key is claimed. Nothing was done."
)


def _validated(operation: Operation) -> bool:
    """Whether Ninja validates parameters of ``operation`` and did not declare its own 422.

    A ``422`` the operation declares (``response={422: ...}``) is Ninja's to describe:
    its ``application/json`` entry stays as generated, the problem is added beside it.
    """
    return bool(operation.models) and 422 not in operation.response_models


def openapi_extra(options: Options, operation: Operation) -> dict[str, Any]:
    """The ``openapi_extra`` of a protected ``operation``: the key header and responses.

    Merged by Ninja into the operation's entry of ``api.get_openapi_schema()``: the
    ``Idempotency-Key`` header parameter (unless ``key=`` reads another field),
    ``Idempotent-Replayed`` on the 2xx responses, the ``400``/``409``/``422`` problem
    responses and the ``x-idempotency`` policy. The ``422`` describes both: the
    ``application/problem+json`` of ``key-reused`` and Ninja's own validation error
    (``application/json``, :data:`VALIDATION_ERROR_SCHEMA`) of an operation with
    parameters. What ``operation.openapi_extra`` already declares wins over these.

    Args:
        options: the operation's idempotency options (settings read now).
        operation: the Ninja ``Operation``, its response models built.
    """
    extra: dict[str, Any] = dict(operation.openapi_extra or {})
    if options.key is None:  # key= reads its own field of the request
        extra["parameters"] = [
            {
                "in": "header",
                "name": HEADER,
                "required": options.get_required(),
                "schema": {"type": "string", "minLength": 1, "maxLength": conf.max_key_length},
                "description": header_description(options),
            },
            *extra.get("parameters", []),
        ]
    # Keyed by status code as ``int``, as Ninja keys the responses it generates, so
    # these merge into Ninja's own (``openapi_extra`` is merged key by key).
    responses: dict[Any, Any] = dict(extra.get("responses", {}))
    for code in operation.response_models:
        if isinstance(code, int) and 200 <= code < 300:
            response = dict(responses.get(code, {}))
            response["headers"] = {
                REPLAYED_HEADER: {
                    "schema": {"type": "string", "enum": ["true"]},
                    "description": "Present when this is a replay of the stored response.",
                },
                **response.get("headers", {}),
            }
            responses[code] = response
    for text, description in PROBLEM_RESPONSES.items():
        code = int(text)
        content: dict[str, Any] = {problems.CONTENT_TYPE: {"schema": dict(PROBLEM_SCHEMA)}}
        if code == 422 and _validated(operation):
            content[_JSON] = {"schema": dict(VALIDATION_ERROR_SCHEMA)}
            description = f"{description} {_VALIDATION_DESCRIPTION}"
        response = {"description": description, "content": content, **responses.get(code, {})}
        if code == 409:
            response["headers"] = {
                "Retry-After": {
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "Seconds to wait before retrying with the same key.",
                },
                **response.get("headers", {}),
            }
        responses[code] = response
    extra["responses"] = responses
    extra.setdefault(EXTENSION, policy(options))
    return extra
