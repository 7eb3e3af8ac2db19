"""The checks of protected views see Django Ninja's operations (docs/checks.md).

This module is the URLconf: a ``NinjaAPI`` whose operations break W002, E009, W001 and
E012 as a view would, listed with every other kind of protected endpoint by
``checks.urls.protected_endpoints``.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.http import HttpRequest
from django.test import override_settings
from django.urls import path
from ninja import NinjaAPI, Router

from django_idempotency.checks.databases import check_view_databases
from django_idempotency.checks.tenants import check_public_urlconf
from django_idempotency.checks.urls import protected_endpoints
from django_idempotency.checks.views import check_atomic_requests, check_view_retention
from django_idempotency.contrib.ninja import api_urls, idempotent

router = Router()


@router.post("/archive")
@idempotent(retention=30 * 86400)
def archive(request: HttpRequest) -> dict[str, Any]:
    return {}


@router.post("/nowhere")
@idempotent(using="no_such_alias")
def nowhere(request: HttpRequest) -> dict[str, Any]:
    return {}


@router.post("/plain")
def plain(request: HttpRequest) -> dict[str, Any]:
    return {}


api = NinjaAPI(urls_namespace="ninja-checks")
api.add_router("/", router)
exempt_api = NinjaAPI(urls_namespace="ninja-checks-exempt")
exempt_router = Router()


@exempt_router.post("/exempt")
@idempotent
def exempt(request: HttpRequest) -> dict[str, Any]:
    return {}


exempt_api.add_router("/", exempt_router)

urlpatterns = [path("api/", api.urls), path("exempt/", api_urls(exempt_api))]

pytestmark = pytest.mark.urls(__name__)

HERE = __name__


def test_the_listing_names_each_protected_operation_once_per_url() -> None:
    listed = [(f"{e.obj.__module__}.{e.obj.__qualname__}", e.kind) for e in protected_endpoints()]
    assert sorted(listed) == [
        (f"{HERE}.archive", "ninja"),
        (f"{HERE}.exempt", "ninja"),
        (f"{HERE}.nowhere", "ninja"),
    ]


@override_settings(IDEMPOTENCY={"MAX_RETENTION": 7 * 86400})
def test_w002_a_ninja_operation_keeps_keys_longer_than_max_retention() -> None:
    (message,) = check_view_retention()
    assert message.id == "django_idempotency.W002"
    assert message.obj == f"{HERE}.archive"
    assert "2592000 s (30 days)" in message.msg


def test_e009_a_ninja_operation_names_an_unknown_database() -> None:
    (message,) = check_view_databases()
    assert message.id == "django_idempotency.E009"
    assert f"{HERE}.nowhere" in message.msg and "'no_such_alias'" in message.msg


@override_settings(
    SHARED_APPS=["django_tenants"],
    TENANT_APPS=["django_idempotency"],
    PUBLIC_SCHEMA_URLCONF=HERE,
)
def test_e012_ninja_operations_in_the_public_urlconf_without_public_tables() -> None:
    (message,) = check_public_urlconf()
    assert message.id == "django_idempotency.E012"
    assert f"{HERE}.archive" in message.msg and f"{HERE}.nowhere" in message.msg


def test_w001_ninja_operations_inside_atomic_requests_unless_mounted_with_api_urls(
    monkeypatch: Any, settings: Any
) -> None:
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    messages = check_atomic_requests()
    assert sorted(m.obj for m in messages) == [f"{HERE}.archive", f"{HERE}.nowhere"]
    assert {m.id for m in messages} == {"django_idempotency.W001"}
    assert "api_urls(api)" in messages[0].hint
