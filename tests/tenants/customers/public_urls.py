"""A public-schema URLconf without idempotent views (tests/checks/test_tenant_checks.py)."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("", lambda request: HttpResponse("home"))]
