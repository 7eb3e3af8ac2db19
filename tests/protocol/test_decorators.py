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
from tests.support.factories import UserFactory
from tests.support.testapp.models import Widget


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
    from django_idempotency.protocol.begin import normalise_route

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
    from django_idempotency.checks.views import check_mixin_actions

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
    from django_idempotency.checks.views import check_mixin_actions

    assert check_mixin_actions() == []


# --- a mixin or a decorator where it cannot work is refused, never silently off -------

from django.utils.decorators import method_decorator  # noqa: E402
from django.views import View  # noqa: E402
from django.views.decorators.cache import never_cache  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from rest_framework import generics, mixins, viewsets  # noqa: E402
from rest_framework.decorators import action  # noqa: E402
from rest_framework.test import APIRequestFactory, force_authenticate  # noqa: E402

from django_idempotency import IdempotentMixin  # noqa: E402
from django_idempotency.protocol.drf import overridden_methods  # noqa: E402

OVERRIDDEN = ("get_content_negotiator", "as_view", "initial")


@pytest.mark.parametrize(
    "view_base",
    [
        viewsets.ModelViewSet,
        viewsets.ViewSet,
        APIView,
        generics.CreateAPIView,
    ],
)
def test_the_mixin_after_the_view_class_is_refused_when_the_class_is_defined(view_base):
    """``class V(viewsets.ModelViewSet, IdempotentMixin)``: DRF's ``initial()`` (and
    ``as_view()``, ``get_content_negotiator()``) shadow the mixin's, so no request would
    be protected. The class statement raises ``TypeError`` naming the methods and the
    bases to write instead."""
    with pytest.raises(TypeError) as refused:

        class Misordered(view_base, IdempotentMixin):
            pass

    message = str(refused.value)
    assert "APIView.initial()" in message and "do not call super()" in message, message
    assert f"class Misordered(IdempotentMixin, {view_base.__name__})" in message, message


def test_the_mixin_overrides_these_methods_of_drf_views():
    """The methods checked when a class is built are every method of DRF's views that
    the mixin overrides."""
    assert set(overridden_methods()) == set(OVERRIDDEN)


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_each_method_the_mixin_overrides_is_checked_when_the_class_is_defined(name):
    """A base placed before the mixin that defines one of its methods without calling
    ``super()`` shadows it: ``TypeError`` names that base's method."""

    def without_super(*args, **kwargs):
        return None

    method = classmethod(without_super) if name == "as_view" else without_super
    Shadow = type("Shadow", (), {name: method})

    with pytest.raises(TypeError, match=rf"Shadow\.{name}\(\)"):
        type("Misordered", (Shadow, IdempotentMixin, APIView), {"__module__": __name__})


def test_the_mixin_on_a_django_class_based_view_is_refused():
    """Django's ``View`` never calls ``initial()``: the mixin there protects nothing, so
    the class statement raises ``TypeError`` pointing at ``@idempotent`` on handlers."""
    with pytest.raises(TypeError, match=r"Django class-based view.*@idempotent"):

        class Plain(IdempotentMixin, View):
            pass


@pytest.mark.parametrize("stack", ["twice", "around @api_view over @idempotent"])
def test_idempotent_over_idempotent_is_refused(stack):
    """Two ``@idempotent`` on one view would claim each key twice, the inner claim
    answering 409 to the outer: refused when the outer one is applied (through
    ``method_decorator``, which applies it at each request, the check E010 sees it)."""

    def view(request):
        return Response({})

    with pytest.raises(TypeError, match="already @idempotent"):
        if stack == "twice":
            idempotent(idempotent(view))
        else:
            idempotent(api_view(["POST"])(idempotent(view)))


@pytest.mark.parametrize("kind", [staticmethod, classmethod])
def test_idempotent_above_staticmethod_or_classmethod_is_refused(kind):
    """Above ``@staticmethod``/``@classmethod`` the view would get the wrong arguments at
    every request; refused when the class is written, naming the order that works."""
    with pytest.raises(TypeError, match=rf"Put @{kind.__name__} above @idempotent"):

        class V(APIView):
            @idempotent
            @kind
            def post(request):
                return Response({})


def test_idempotent_on_a_class_is_refused():
    """``@idempotent`` on a class statement: refused, pointing at its handlers."""
    with pytest.raises(TypeError, match="decorate its handler methods"):

        @idempotent
        class V(APIView):
            def post(self, request):
                return Response({})


RAN: list[str] = []


def _created(name: str) -> Response:
    RAN.append(name)
    return Response({"n": len(RAN)}, status=201)


class _MixinAfterAPassingMixin:
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)


class _LoggedMixinView(_MixinAfterAPassingMixin, IdempotentMixin, APIView):
    def post(self, request):
        return _created("mixin after a mixin that calls super()")


class _ActionOutermost(viewsets.ViewSet):
    @action(detail=True, methods=["post"])
    @idempotent
    def reboot(self, request, pk=None):
        return _created("@action over @idempotent")


class _ActionInnermost(viewsets.ViewSet):
    @idempotent
    @action(detail=True, methods=["post"])
    def reboot(self, request, pk=None):
        return _created("@idempotent over @action")


@method_decorator(idempotent, name="post")
class _MethodDecorated(APIView):
    def post(self, request):
        return _created("method_decorator(idempotent, name='post')")


class _OverMethodDecorator(APIView):
    @idempotent
    @method_decorator(never_cache)
    def post(self, request):
        return _created("@idempotent over method_decorator(never_cache)")


class _MixinCreate(IdempotentMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    def create(self, request, *args, **kwargs):
        return _created("IdempotentMixin first, a ViewSet's create")


class _SubclassCallingSuper(_MixinCreate):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)


@csrf_exempt
@idempotent
def _csrf_exempt_outermost(request):
    return _created("@csrf_exempt over @idempotent")


@idempotent
@api_view(["POST"])
@csrf_exempt
def _idempotent_over_api_view(request):
    return _created("@idempotent over @api_view over @csrf_exempt")


@method_decorator(idempotent, name="dispatch")
class _DjangoDispatch(View):
    def post(self, request):
        from django.http import JsonResponse

        RAN.append("Django view, method_decorator(idempotent, name='dispatch')")
        return JsonResponse({"n": len(RAN)}, status=201)


class _DjangoHandler(View):
    @idempotent
    def post(self, request):
        from django.http import JsonResponse

        RAN.append("Django view, @idempotent on post")
        return JsonResponse({"n": len(RAN)}, status=201)


WORKING = {
    "Django view's dispatch": (_DjangoDispatch.as_view(), {}),
    "Django view's post": (_DjangoHandler.as_view(), {}),
    "mixin after a passing mixin": (_LoggedMixinView.as_view(), {}),
    "@action over @idempotent": (_ActionOutermost.as_view({"post": "reboot"}), {"pk": "1"}),
    "@idempotent over @action": (_ActionInnermost.as_view({"post": "reboot"}), {"pk": "1"}),
    "method_decorator name=post": (_MethodDecorated.as_view(), {}),
    "@idempotent over method_decorator": (_OverMethodDecorator.as_view(), {}),
    "mixin first on a ViewSet": (_MixinCreate.as_view({"post": "create"}), {}),
    "subclass calling super().initial()": (_SubclassCallingSuper.as_view({"post": "create"}), {}),
    "@idempotent over @api_view": (_idempotent_over_api_view, {}),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stack", sorted(WORKING))
def test_the_stackings_that_can_work_protect_the_view(stack):
    """Every order that can work keeps working: a POST without a key is refused (400),
    a retry with the same key is a replay of the first answer, and the view ran once."""
    view, kwargs = WORKING[stack]
    user = UserFactory(username=f"stack-{uuid.uuid4().hex[:8]}")
    key = str(uuid.uuid4())
    factory = APIRequestFactory()

    def post(**headers):
        request = factory.post("/stacked", {}, format="json", **headers)
        force_authenticate(request, user)
        request.user = user  # Django's views read it from the middleware's attribute
        response = view(request, **kwargs)
        return response.render() if hasattr(response, "render") else response

    RAN.clear()
    assert post().status_code == 400
    first = post(HTTP_IDEMPOTENCY_KEY=key)
    again = post(HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert len(RAN) == 1, RAN


@pytest.mark.django_db(transaction=True)
def test_csrf_exempt_above_or_below_idempotent_keeps_both():
    """``@csrf_exempt`` keeps its mark in either order, and the view stays protected."""
    assert _csrf_exempt_outermost.csrf_exempt is True
    assert _idempotent_over_api_view.csrf_exempt is True
    assert idempotent(csrf_exempt(_view_for_marks)).csrf_exempt is True


def _view_for_marks(request):
    return Response({})
