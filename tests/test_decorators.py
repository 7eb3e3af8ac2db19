from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord
from django_idempotency.principals import auth_token_principal, user_principal
from tests.factories import UserFactory
from tests.testapp.models import Widget


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="Unknown idempotency option"):
        idempotent(leese=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease": 0},
        {"retention": -5},
        {"wait": -1},
        {"replay_headers": "X-A"},
        {"lease": 600, "retention": 60},
        {"replay_headers": ["X-A", "Set-Cookie"]},
    ],
)
def test_invalid_option_values(kwargs):
    with pytest.raises(TypeError):
        idempotent(**kwargs)


def test_class_based_view_as_a_whole_is_refused():
    class V(APIView):
        def post(self, request):
            return Response()

    with pytest.raises(TypeError, match="IdempotentMixin"):
        idempotent(V.as_view())


def test_above_api_view_protects_the_handlers():
    @idempotent
    @api_view(["GET", "POST"])
    def view(request):
        return Response({})

    assert hasattr(view.cls.post, "_idempotency_options")
    assert not hasattr(view.cls.get, "_idempotency_options")
    assert "default" in view._non_atomic_requests


def test_request_not_found_is_a_type_error():
    @idempotent
    def view(a, b):
        return None

    with pytest.raises(TypeError, match="could not find the request"):
        view(1, 2)


@pytest.mark.django_db(transaction=True)
def test_async_view(key=None):
    key = str(uuid.uuid4())
    client = Client()
    client.force_login(UserFactory(username="erin"))
    first = client.post("/async", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    again = client.post("/async", HTTP_IDEMPOTENCY_KEY=key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert Widget.objects.filter(name="async").count() == 1
    assert IdempotencyRecord.objects.count() == 1
    assert json.loads(first.content)["id"] == Widget.objects.get().pk


@pytest.mark.django_db
def test_principal_resolvers(alice):
    from rest_framework.test import APIRequestFactory

    request = APIRequestFactory().post("/x")
    request.user = alice.user
    request.auth = alice
    assert user_principal(request) == f"auth.user:{alice.user.pk}"
    principal = auth_token_principal(request)
    assert principal.startswith("authtoken.token:") and alice.key not in principal
    assert principal == auth_token_principal(request)  # stable
    request.auth = "a-jwt-string"
    assert auth_token_principal(request).startswith("credential:")
    assert "a-jwt-string" not in auth_token_principal(request)
    request.auth = None
    assert auth_token_principal(request) is None


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ("v1/workers/<int:pk>/reboot", "v1/workers/{pk}/reboot"),
        ("v1/workers/<pk>", "v1/workers/{pk}"),
        ("^vs/widgets/(?P<pk>[^/.]+)/resize/$", "vs/widgets/{pk}/resize/"),
        ("^vs/widgets/$", "vs/widgets/"),
        ("^v1/(?P<year>[0-9]{4})/(?P<slug>(a|b)+)$", "v1/{year}/{slug}"),
    ],
)
def test_endpoint_routes_are_normalised(route, expected):
    from django_idempotency.protocol import normalise_route

    assert normalise_route(route) == expected


@pytest.mark.django_db
def test_dotted_path_options(api):
    view = idempotent(principal="django_idempotency.principals.user_principal")(lambda r: r)
    options = view._idempotency_options
    assert options.get_principal() is user_principal


def test_mixin_options_are_validated_when_the_class_is_defined():
    from rest_framework import viewsets

    from django_idempotency import IdempotentMixin

    with pytest.raises(TypeError, match="retension"):

        class Misspelt(IdempotentMixin, viewsets.ViewSet):
            idempotent_actions = {"create": {"retension": 60}}

    with pytest.raises(TypeError, match="Unknown idempotency option"):

        class BadDefaults(IdempotentMixin, viewsets.ViewSet):
            idempotency_options = {"leese": 5}


def test_e008_unknown_mixin_action(settings):
    from django.urls import clear_url_caches, path
    from rest_framework import mixins, viewsets

    from django_idempotency import IdempotentMixin
    from django_idempotency.checks_views import check_mixin_actions

    class Typo(IdempotentMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
        idempotent_actions = ["craete"]

    module = type("urls", (), {})()
    module.urlpatterns = [path("typo", Typo.as_view({"post": "create"}))]
    settings.ROOT_URLCONF = module
    clear_url_caches()
    try:
        (error,) = check_mixin_actions()
    finally:
        clear_url_caches()
    assert error.id == "django_idempotency.E008" and "'craete'" in error.msg


def test_no_e008_for_the_test_urls():
    from django_idempotency.checks_views import check_mixin_actions

    assert check_mixin_actions() == []
