"""A tenant's own tables: what its view writes and what its outbox handler receives."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """One execution of the order view (in the tenant's schema)."""

    item = models.CharField(max_length=100)


class Delivery(models.Model):
    """One call of the outbox handler, written in the schema the relay delivered from."""

    order = models.BigIntegerField()
    dedup_key = models.CharField(max_length=255)
