"""``/v1/workers``, ``/v1/workers/<id>``, ``/v1/workers/<id>/reboot`` and ``.../renew``."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter(trailing_slash=False, use_regex_path=False)
router.register("workers", views.WorkerViewSet, basename="worker")

urlpatterns = [
    *router.urls,
    path("workers/<str:pk>/renew", views.renew_lease, name="worker-renew"),
]
