"""One table: the row the benchmark's view inserts."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A created resource."""

    name = models.CharField(max_length=100)
    size = models.IntegerField(default=0)
