"""System checks of schema-per-tenant projects (django-tenants; E011, E012, W010).

django-tenants migrates ``SHARED_APPS`` into the ``public`` schema and ``TENANT_APPS``
into every tenant's schema (docs/tenants.md). Where the app's tables are decides where
records and outbox messages live; these checks catch the layouts that cannot work, or
that share one tenant's records with the others. They run only when the settings name
``TENANT_APPS`` (django-tenants' layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from django_idempotency.checks.urls import protected_endpoints

APP = "django_idempotency"
_DOCS = "docs/tenants.md"


def _lists() -> tuple[list[str], list[str]] | None:
    """(``SHARED_APPS``, ``TENANT_APPS``) of a django-tenants project; ``None`` otherwise."""
    tenant_apps = getattr(settings, "TENANT_APPS", None)
    if tenant_apps is None:
        return None
    return list(getattr(settings, "SHARED_APPS", None) or ()), list(tenant_apps)


def _has_app(apps: list[str]) -> bool:
    return any(name == APP or name.startswith(f"{APP}.apps.") for name in apps)


@register(Tags.database)
def check_tenant_layout(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E011: the app in neither list; W010: in ``SHARED_APPS`` only (records shared)."""
    lists = _lists()
    if lists is None:
        return []
    shared, tenant = lists
    if not _has_app(shared) and not _has_app(tenant):
        return [
            Error(
                "django_idempotency is in neither SHARED_APPS nor TENANT_APPS: "
                "migrate_schemas creates its tables in no schema, so every claim fails.",
                hint="Add 'django_idempotency' to TENANT_APPS: each tenant's records and "
                f"outbox in its own schema ({_DOCS}).",
                id="django_idempotency.E011",
            )
        ]
    if _has_app(shared) and not _has_app(tenant):
        return [
            Warning(
                "django_idempotency is in SHARED_APPS only: every tenant's records and "
                "outbox messages share the public schema. A key claimed in one tenant "
                "replays in another for the same principal, unless the "
                "PRINCIPAL_RESOLVER names the tenant; outbox handlers run in the public "
                "schema; a tenant's records outlive its schema.",
                hint="Add 'django_idempotency' to TENANT_APPS, or keep this layout with "
                f"a principal that names the tenant and silence this warning ({_DOCS}).",
                id="django_idempotency.W010",
            )
        ]
    return []


def _public_urlconf() -> tuple[str, str] | None:
    """The URLconf django-tenants serves on the public schema, and where it comes from.

    ``PUBLIC_SCHEMA_URLCONF`` when set; otherwise the public site is served from
    ``ROOT_URLCONF``, like every tenant's.
    """
    urlconf = getattr(settings, "PUBLIC_SCHEMA_URLCONF", None)
    if urlconf:
        return str(urlconf), "PUBLIC_SCHEMA_URLCONF"
    root = getattr(settings, "ROOT_URLCONF", None)
    if root:
        return str(root), "ROOT_URLCONF (no PUBLIC_SCHEMA_URLCONF is set)"
    return None


@register(Tags.urls)
def check_public_urlconf(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E012: idempotent views served on the public schema while it has no record table.

    The public schema serves ``PUBLIC_SCHEMA_URLCONF``, or ``ROOT_URLCONF`` when that
    is not set; with the app in ``TENANT_APPS`` only, a keyed request there finds no
    table and is refused (500 ``store-not-set-up``).
    """
    lists = _lists()
    public = _public_urlconf()
    if lists is None or public is None or _has_app(lists[0]):
        return []
    urlconf, source = public
    views = sorted(
        {
            f"{obj.__module__}.{getattr(obj, '__qualname__', obj)}"
            for obj, _options, _kind in protected_endpoints(str(urlconf))
        }
    )
    if not views:
        return []
    return [
        Error(
            f"Idempotent views of {source} ({', '.join(views)}) are served on the public "
            "schema, which has no idempotency tables: django_idempotency is not in "
            "SHARED_APPS, so every keyed request to the public site is refused.",
            hint="Set PUBLIC_SCHEMA_URLCONF to a URLconf without idempotent views (the "
            "public site's own), or add 'django_idempotency' to SHARED_APPS as well "
            f"(public then keeps its own records) ({_DOCS}).",
            id="django_idempotency.E012",
        )
    ]
