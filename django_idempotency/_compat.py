"""Differences between the supported Django versions, in one place."""

from __future__ import annotations

from typing import Any

import django
from django.db import models


def check_constraint(condition: models.Q, name: str) -> models.CheckConstraint:
    """A ``CheckConstraint`` for the running Django (``check=`` before 5.1)."""
    kwargs: dict[str, Any] = {"name": name}
    kwargs["condition" if django.VERSION >= (5, 1) else "check"] = condition
    return models.CheckConstraint(**kwargs)
