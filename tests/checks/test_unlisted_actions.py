"""W011 and ``idempotency_exempt_actions``: a mutating action of an ``IdempotentMixin``
view is protected or exempted by name, never left out by mistake (docs/checks.md).

This module is the URLconf of its tests.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.urls import include, path
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.test import APIClient
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin
from django_idempotency.checks.actions import check_unlisted_actions
from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.keys import HEADER
from tests.support.testapp.models import Widget
from tests.support.testapp.views import WidgetSerializer


class _Editable(
    IdempotentMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet
):
    queryset = Widget.objects.all()
    serializer_class = WidgetSerializer


class ListedViewSet(_Editable):
    """Protects create only: update, partial_update and archive are neither."""

    idempotent_actions = ["create"]
    idempotency_exempt_actions = ["refresh"]

    @action(detail=True, methods=["post"])
    def archive(self, request: Any, pk: Any = None) -> Response:
        return Response({})

    @action(detail=True, methods=["post"])
    def refresh(self, request: Any, pk: Any = None) -> Response:
        return Response({})

    @action(detail=False, methods=["get"])
    def recent(self, request: Any) -> Response:
        return Response([])


class DeclaredViewSet(_Editable):
    """Every mutating action protected or exempt: nothing to report."""

    idempotent_actions = {"create": {}, "update": {}}
    idempotency_exempt_actions = ["partial_update"]


class EveryActionViewSet(_Editable):
    """``None``: every unsafe action protected but the exempt one."""

    idempotency_exempt_actions = ["touch"]

    @action(detail=False, methods=["post"])
    def touch(self, request: Any) -> Response:
        Widget.objects.create(name="touched")
        return Response({"touched": Widget.objects.filter(name="touched").count()})


class PartlyListedView(IdempotentMixin, APIView):
    idempotent_actions = ["post"]

    def post(self, request: Any) -> Response:
        return Response({})

    def delete(self, request: Any) -> Response:
        return Response({})


router = SimpleRouter()
router.register("listed", ListedViewSet, basename="listed")
router.register("declared", DeclaredViewSet, basename="declared")
router.register("every", EveryActionViewSet, basename="every")
urlpatterns = [path("", include(router.urls)), path("partly/", PartlyListedView.as_view())]

pytestmark = pytest.mark.urls(__name__)


def test_w011_names_each_mutating_action_neither_protected_nor_exempt() -> None:
    messages = {m.obj: m for m in check_unlisted_actions()}
    assert set(messages) == {f"{__name__}.ListedViewSet", f"{__name__}.PartlyListedView"}
    listed = messages[f"{__name__}.ListedViewSet"]
    assert listed.id == "django_idempotency.W011"
    assert "'archive', 'partial_update', 'update' without idempotency" in listed.msg
    assert "idempotency_exempt_actions = ['archive', 'partial_update', 'update']" in listed.hint
    assert "'delete' without idempotency" in messages[f"{__name__}.PartlyListedView"].msg


@pytest.mark.django_db
def test_an_exempt_action_runs_unprotected_beside_the_protected_ones(alice: Any) -> None:
    client = APIClient()
    client.force_authenticate(alice.user)
    key = str(uuid.uuid4())
    for expected in (1, 2):  # exempt: a retry runs again, nothing recorded
        touched = client.post("/every/touch/", HTTP_IDEMPOTENCY_KEY=key)
        assert touched.status_code == 200 and touched.json() == {"touched": expected}
        assert not touched.has_header("Idempotent-Replayed")
    assert IdempotencyRecord.objects.count() == 0
    created = client.post("/every/", {"name": "w"}, format="json", headers={HEADER: key})
    replay = client.post("/every/", {"name": "w"}, format="json", headers={HEADER: key})
    assert created.status_code == 201 and replay["Idempotent-Replayed"] == "true"


def test_an_action_both_protected_and_exempt_is_refused_when_declared() -> None:
    with pytest.raises(TypeError, match="both protects and exempts 'create'"):

        class Both(_Editable):
            idempotent_actions = ["create"]
            idempotency_exempt_actions = ["create"]

    with pytest.raises(TypeError, match="idempotency_exempt_actions must be a list"):

        class Text(_Editable):
            idempotency_exempt_actions = "touch"
