from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from django_idempotency.checks import check_settings


def ids(messages):
    return [m.id for m in messages]


def test_default_settings_are_clean():
    assert check_settings() == []


@override_settings(IDEMPOTENCY=["not", "a", "dict"])
def test_e001_not_a_dict():
    assert ids(check_settings()) == ["django_idempotency.E001"]


@override_settings(IDEMPOTENCY={"LEASE_SECONDS": 5})
def test_e001_unknown_key():
    (message,) = check_settings()
    assert message.id == "django_idempotency.E001" and "LEASE_SECONDS" in message.msg


@pytest.mark.parametrize("value", [0, 256, "x"])
def test_e002_max_key_length(value):
    with override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": value}):
        assert ids(check_settings()) == ["django_idempotency.E002"]


@pytest.mark.parametrize(
    "values",
    [{"LEASE": 0}, {"RETENTION": -1}, {"WAIT": -1}, {"LEASE": 100, "RETENTION": 50}],
)
def test_e003_durations(values):
    with override_settings(IDEMPOTENCY=values):
        assert ids(check_settings()) == ["django_idempotency.E003"]


@override_settings(IDEMPOTENCY={"REPLAY_HEADERS": ["X-Version", "Set-Cookie", "traceparent"]})
def test_e004_forbidden_replay_headers():
    (message,) = check_settings()
    assert message.id == "django_idempotency.E004"
    assert "Set-Cookie" in message.msg and "traceparent" in message.msg
    assert "X-Version" not in message.msg


@override_settings(IDEMPOTENCY={"PRINCIPAL_RESOLVER": "no.such.module.resolver"})
def test_e005_unimportable_resolver():
    assert ids(check_settings()) == ["django_idempotency.E005"]


def test_checks_are_registered():
    registered = checks.registry.registry.get_checks()
    names = {c.__name__ for c in registered}
    assert {"check_settings", "check_atomic_requests"} <= names
