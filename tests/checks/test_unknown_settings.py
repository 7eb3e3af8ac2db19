"""An unknown ``IDEMPOTENCY`` key is reported (E001) with the known name it was meant as."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_idempotency.checks.settings import check_settings


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("RETENTON", "RETENTION"),
        ("retention", "RETENTION"),
        ("OUTBOX_MARK_DELAYS", "OUTBOX_MARK_DELAY"),
    ],
)
def test_a_misspelt_setting_is_answered_with_the_nearest_known_name(typo, meant):
    with override_settings(IDEMPOTENCY={typo: 1}):
        (message,) = check_settings()
    assert message.id == "django_idempotency.E001" and repr(typo) in message.msg
    assert message.hint.startswith(f"Did you mean {meant}?")


def test_a_setting_like_no_known_one_points_at_the_reference_without_listing_all():
    with override_settings(IDEMPOTENCY={"COLOUR_OF_THE_BIKESHED": "green"}):
        (message,) = check_settings()
    assert message.id == "django_idempotency.E001"
    assert "Did you mean" not in message.hint and "docs/configuration.md" in message.hint
    assert "RETENTION" not in message.hint


def test_each_unknown_setting_is_its_own_error():
    with override_settings(IDEMPOTENCY={"RETENTON": 1, "LEASSE": 2}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_idempotency.E001"] * 2
    assert [m.hint.split("?")[0] for m in messages] == [
        "Did you mean LEASE",
        "Did you mean RETENTION",
    ]
