"""pytest plugin (entry point ``pytest11``): the ``idempotency_kit`` fixture.

Loaded automatically where django-idempotency is installed; the fixture needs
pytest-django. Nothing here imports Django until a test asks for the fixture.
"""

from __future__ import annotations

from typing import Any

import pytest


class Kit:
    """What the ``idempotency_kit`` fixture gives a test.

    The helpers of ``django_idempotency.testing`` as attributes: ``fire_duplicates``,
    ``fence_stale_owner``, ``travel`` and ``past_lease``.
    """

    def __init__(self) -> None:
        from django_idempotency.testing import (
            fence_stale_owner,
            fire_duplicates,
            past_lease,
            travel,
        )

        self.fire_duplicates = fire_duplicates
        self.fence_stale_owner = fence_stale_owner
        self.travel = travel
        self.past_lease = past_lease


@pytest.fixture
def idempotency_kit(transactional_db: Any) -> Kit:
    """The testing kit, in a test whose writes are committed (``transactional_db``)."""
    return Kit()
