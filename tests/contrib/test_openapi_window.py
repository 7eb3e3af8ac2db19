"""Each protected operation publishes its key policy: retention window and lease."""

from __future__ import annotations

import pytest
from django.test import override_settings

pytest.importorskip("drf_spectacular")

from django_idempotency.contrib.openapi import EXTENSION, duration
from tests.support.openapi import SCHEMA_SETTINGS, build_views, generate, header


@pytest.fixture
def paths():
    with override_settings(REST_FRAMEWORK=SCHEMA_SETTINGS):
        patterns = build_views()
    return generate(patterns)["paths"]


def test_each_operation_states_its_own_window_and_lease(paths):
    below = paths["/below"]["post"]  # defaults: 24 h, 60 s
    assert below[EXTENSION] == {
        "header": "Idempotency-Key",
        "required": True,
        "retentionSeconds": 86400.0,
        "leaseSeconds": 60.0,
    }
    assert "Retention window: 24 hours" in header(below)["description"]
    assert "Lease: 1 minute" in header(below)["description"]
    above = paths["/above"]["post"]  # lease=5
    assert above[EXTENSION]["leaseSeconds"] == 5.0
    assert "Lease: 5 seconds" in header(above)["description"]
    optional = paths["/optional"]["post"]  # required=False, retention 7 days
    assert optional[EXTENSION]["required"] is False
    assert optional[EXTENSION]["retentionSeconds"] == 7 * 86400.0
    assert "Retention window: 7 days" in header(optional)["description"]
    create = paths["/vs/widgets/"]["post"]  # the mixin's per-action retention
    assert create[EXTENSION]["retentionSeconds"] == 3600.0
    assert "Retention window: 1 hour" in header(create)["description"]


def test_unprotected_operations_publish_no_policy(paths):
    assert EXTENSION not in paths["/vs/widgets/{id}/poke/"]["post"]
    assert EXTENSION not in paths["/vs/widgets/"]["get"]


def test_the_settings_in_force_when_generated_are_published():
    with override_settings(REST_FRAMEWORK=SCHEMA_SETTINGS):
        patterns = build_views()
    with override_settings(IDEMPOTENCY={"RETENTION": 2 * 86400, "LEASE": 90}):
        below = generate(patterns)["paths"]["/below"]["post"]
    assert below[EXTENSION]["retentionSeconds"] == 2 * 86400.0
    assert "Retention window: 2 days" in header(below)["description"]
    assert "Lease: 90 seconds" in header(below)["description"]


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(1, "1 second"), (90, "90 seconds"), (60, "1 minute"), (1.5, "1.5 seconds"),
     (3600, "1 hour"), (7200, "2 hours"), (86400, "24 hours"), (172800, "2 days"),
     (604800, "7 days")],
)  # fmt: skip
def test_duration_in_words(seconds, words):
    assert duration(seconds) == words
