"""One table: the row the benchmark's view inserts."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A created resource."""

    name = models.CharField(max_length=100)
    size = models.IntegerField(default=0)


class FloorRecord(models.Model):
    """The least an idempotency record can be: the floor view's claim and its response.

    Nothing of django_idempotency: one unique scope, the response stored with the view's
    writes. ``benchmarks/minimal_view.py`` measures it as the ``floor`` mode.
    """

    principal = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    response_status = models.IntegerField(null=True)
    response_body = models.BinaryField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="floor_scope_uniq")
        ]
