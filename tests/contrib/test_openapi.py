from __future__ import annotations

import subprocess
import sys

import pytest
from django.test import override_settings
from django.urls import path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin, idempotent
from tests.support.openapi import PROBLEM, SCHEMA_SETTINGS, build_views, generate, header


@pytest.fixture
def schema():
    with override_settings(REST_FRAMEWORK=SCHEMA_SETTINGS):
        patterns = build_views()
    return generate(patterns)


def assert_protected(operation, *, required):
    param = header(operation)
    assert param is not None, operation["operationId"]
    assert param["in"] == "header" and param.get("required", False) is required
    assert param["schema"] == {"type": "string", "minLength": 1, "maxLength": 255}
    for code in ("400", "409", "422"):
        content = operation["responses"][code]["content"][PROBLEM]
        assert content["schema"] == {"$ref": "#/components/schemas/IdempotencyProblem"}
    assert "Retry-After" in operation["responses"]["409"]["headers"]
    success = [r for c, r in operation["responses"].items() if c.startswith("2")]
    assert success and all("Idempotent-Replayed" in r["headers"] for r in success)


def assert_unprotected(operation):
    assert header(operation) is None
    assert "409" not in operation["responses"] and "422" not in operation["responses"]


def test_function_views_below_and_above_api_view(schema):
    paths = schema["paths"]
    assert_protected(paths["/below"]["post"], required=True)
    assert_protected(paths["/above"]["post"], required=True)
    assert_protected(paths["/optional"]["post"], required=False)


def test_apiview_method_and_viewset_mixin_actions(schema):
    paths = schema["paths"]
    assert_protected(paths["/widgets/{id}/reboot"]["post"], required=True)
    assert_protected(paths["/vs/widgets/"]["post"], required=True)  # create
    assert_protected(paths["/vs/widgets/{id}/resize/"]["post"], required=True)
    assert_unprotected(paths["/vs/widgets/{id}/poke/"]["post"])  # not in idempotent_actions
    assert_unprotected(paths["/vs/widgets/{id}/"]["put"])
    assert_unprotected(paths["/vs/widgets/"]["get"])
    # a decorated action keeps its own options, whatever idempotent_actions says
    assert_protected(paths["/vs/widgets/{id}/"]["delete"], required=False)


def test_a_receiver_with_its_own_key_declares_no_idempotency_key_header(schema):
    operation = schema["paths"]["/hooks/github"]["post"]
    assert header(operation) is None
    assert operation["x-idempotency"]["header"] is None
    assert "409" in operation["responses"] and "422" in operation["responses"]


def test_problem_component(schema):
    component = schema["components"]["schemas"]["IdempotencyProblem"]
    assert component["required"] == ["type", "title", "status", "detail"]
    assert set(component["properties"]) == {"type", "title", "status", "detail"}


def test_required_follows_the_setting_at_generation_time():
    with override_settings(REST_FRAMEWORK=SCHEMA_SETTINGS):
        patterns = build_views()
    generated = generate(patterns, IDEMPOTENCY={"REQUIRED": False})
    assert_protected(generated["paths"]["/below"]["post"], required=False)
    assert_protected(generated["paths"]["/widgets/{id}/reboot"]["post"], required=False)
    assert_protected(generated["paths"]["/optional"]["post"], required=False)


def test_without_the_schema_class_nothing_is_added():
    plain = {**SCHEMA_SETTINGS, "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    with override_settings(REST_FRAMEWORK=plain):
        patterns = build_views()
        generated = SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)
    assert header(generated["paths"]["/below"]["post"]) is None
    assert header(generated["paths"]["/vs/widgets/"]["post"]) is None


class Thing(serializers.Serializer):
    name = serializers.CharField()


def build_annotated_views():
    """Views annotated with @extend_schema, which reads DEFAULT_SCHEMA_CLASS when applied."""

    class ThingView(IdempotentMixin, APIView):
        idempotent_actions = ["post"]
        idempotency_options = {"required": False}

        @extend_schema(
            request=Thing,
            responses={201: Thing, 400: Thing},
            parameters=[OpenApiParameter("X-Trace", location=OpenApiParameter.HEADER)],
        )
        def post(self, request):
            return Response(status=201)

        def put(self, request):
            return Response()

    @extend_schema(responses={202: Thing})
    @api_view(["POST"])
    @idempotent(required=False)
    def queued(request):
        return Response(status=202)

    return [path("things", ThingView.as_view()), path("queued", queued)]


def test_extend_schema_and_mixin_options_merge():
    with override_settings(REST_FRAMEWORK=SCHEMA_SETTINGS):
        patterns = build_annotated_views()
    generated = generate(patterns)
    post = generated["paths"]["/things"]["post"]
    assert_protected(post, required=False)
    assert {p["name"] for p in post["parameters"]} == {"Idempotency-Key", "X-Trace"}
    # the view's own 400 keeps its JSON body and gains the problem+json alternative
    content = post["responses"]["400"]["content"]
    assert set(content) == {"application/json", PROBLEM}
    assert_unprotected(generated["paths"]["/things"]["put"])  # not in idempotent_actions
    assert_protected(generated["paths"]["/queued"]["post"], required=False)
    assert (
        "Idempotent-Replayed"
        in generated["paths"]["/queued"]["post"]["responses"]["202"]["headers"]
    )


def test_package_import_does_not_import_optional_dependencies():
    code = (
        "import sys, django; django.setup();"
        "import django_idempotency, django_idempotency.protocol.decorators,"
        " django_idempotency.protocol.drf,"
        " django_idempotency.metrics, django_idempotency.checks, django_idempotency.admin;"
        "bad = {'drf_spectacular', 'prometheus_client'} & set(sys.modules);"
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
