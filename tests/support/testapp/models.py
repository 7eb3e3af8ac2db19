from __future__ import annotations

from django.db import models


class Widget(models.Model):
    """A business row the test views create, to count executions."""

    name = models.CharField(max_length=100)
    size = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"
