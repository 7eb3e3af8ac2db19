"""Views that render DRF's browsable API, for tests/contrib/test_browsable.py.

Mounted with ``@pytest.mark.urls("tests.support.browsable_app")``: a generic create view
(its page has an HTML form and a raw data form) with ``@idempotent`` on its handler, a
ViewSet with ``IdempotentMixin``, and one on DRF's own ``BrowsableAPIRenderer``.
"""

from __future__ import annotations

from django.urls import path
from rest_framework import generics, mixins, viewsets
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer

from django_idempotency import IdempotentMixin, idempotent
from django_idempotency.contrib.browsable import IdempotentBrowsableAPIRenderer
from tests.support.testapp.models import Widget
from tests.support.testapp.views import WidgetSerializer

RENDERERS = [JSONRenderer, IdempotentBrowsableAPIRenderer]


class WidgetCreate(generics.ListCreateAPIView):  # type: ignore[type-arg]
    queryset = Widget.objects.order_by("pk")
    serializer_class = WidgetSerializer
    renderer_classes = RENDERERS

    @idempotent
    def post(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        return super().post(request, *args, **kwargs)


class WidgetViewSet(
    IdempotentMixin,
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    queryset = Widget.objects.order_by("pk")
    serializer_class = WidgetSerializer
    renderer_classes = RENDERERS
    idempotent_actions = {"create": {}}


class PlainBrowsable(WidgetCreate):
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]


urlpatterns = [
    path("browse/widgets", WidgetCreate.as_view()),
    path("browse/viewset", WidgetViewSet.as_view({"get": "list", "post": "create"})),
    path("browse/plain", PlainBrowsable.as_view()),
]
