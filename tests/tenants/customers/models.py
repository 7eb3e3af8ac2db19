"""The tenants of the schema-per-tenant suite and their domains (django-tenants)."""

from __future__ import annotations

from django.db import models
from django_tenants.models import DomainMixin, TenantMixin


class Client(TenantMixin):
    name = models.CharField(max_length=100)
    auto_create_schema = True
    auto_drop_schema = True


class Domain(DomainMixin):
    pass
