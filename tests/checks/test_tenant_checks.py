"""The checks of schema-per-tenant layouts (django-tenants' SHARED_APPS / TENANT_APPS)."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from django_idempotency.checks.tenants import check_public_urlconf, check_tenant_layout


def ids(messages):
    return [m.id for m in messages]


def test_projects_without_tenant_apps_are_not_checked():
    assert check_tenant_layout() == []
    assert check_public_urlconf() == []


@override_settings(SHARED_APPS=["django_tenants", "customers"], TENANT_APPS=["shop"])
def test_e011_the_app_in_neither_list():
    (message,) = check_tenant_layout()
    assert message.id == "django_idempotency.E011"
    assert "TENANT_APPS" in message.hint


@override_settings(SHARED_APPS=["django_tenants"], TENANT_APPS=["django_idempotency"])
def test_the_app_in_tenant_apps_is_the_recommended_layout():
    assert check_tenant_layout() == []


@override_settings(
    SHARED_APPS=["django_tenants", "django_idempotency"], TENANT_APPS=["django_idempotency"]
)
def test_the_app_in_both_lists_works():
    assert check_tenant_layout() == []


@override_settings(
    SHARED_APPS=["django_tenants", "django_idempotency.apps.IdempotencyConfig"],
    TENANT_APPS=["shop"],
)
def test_w010_the_app_in_shared_apps_only_shares_records_between_tenants():
    (message,) = check_tenant_layout()
    assert message.id == "django_idempotency.W010"
    assert "principal" in message.msg.lower()


@override_settings(
    SHARED_APPS=["django_tenants"],
    TENANT_APPS=["django_idempotency"],
    PUBLIC_SCHEMA_URLCONF="tests.support.urls",
)
def test_e012_idempotent_views_in_the_public_urlconf_without_public_tables():
    (message,) = check_public_urlconf()
    assert message.id == "django_idempotency.E012"
    assert "PUBLIC_SCHEMA_URLCONF" in message.msg and "tests.support" in message.msg


@override_settings(
    SHARED_APPS=["django_tenants", "django_idempotency"],
    TENANT_APPS=["django_idempotency"],
    PUBLIC_SCHEMA_URLCONF="tests.support.urls",
)
def test_public_idempotent_views_work_with_the_app_in_shared_apps_too():
    assert check_public_urlconf() == []


@override_settings(
    SHARED_APPS=["django_tenants"],
    TENANT_APPS=["django_idempotency"],
    PUBLIC_SCHEMA_URLCONF="tests.tenants.customers.public_urls",
)
def test_a_public_urlconf_without_idempotent_views_is_fine():
    assert check_public_urlconf() == []


@override_settings(
    SHARED_APPS=["django_tenants"],
    TENANT_APPS=["django_idempotency"],
    ROOT_URLCONF="tests.support.urls",
)
def test_e012_without_a_public_urlconf_the_public_site_serves_the_root_urlconf():
    with override_settings():
        del settings.PUBLIC_SCHEMA_URLCONF  # absent: django-tenants serves ROOT_URLCONF
        (message,) = check_public_urlconf()
    assert message.id == "django_idempotency.E012"
    assert "ROOT_URLCONF" in message.msg and "tests.support" in message.msg
    assert "PUBLIC_SCHEMA_URLCONF" in message.hint


@override_settings(
    SHARED_APPS=["django_tenants", "django_idempotency"],
    TENANT_APPS=["django_idempotency"],
    ROOT_URLCONF="tests.support.urls",
)
def test_the_root_urlconf_on_public_is_fine_with_the_app_in_shared_apps_too():
    with override_settings():
        del settings.PUBLIC_SCHEMA_URLCONF
        assert check_public_urlconf() == []
