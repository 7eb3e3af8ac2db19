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


# --- W003, W004, E007 (production readiness) ---------------------------------------

from django.db import connection  # noqa: E402

from django_idempotency.checks import (  # noqa: E402
    SWEEP_TASK,
    check_production_database,
    check_response_size,
    check_sweeper_scheduled,
    check_sweeper_scheduled_in_database,
)


def test_w003_non_postgresql_database_in_production():
    with override_settings(DEBUG=False):
        messages = check_production_database()
    if connection.vendor == "postgresql":
        assert messages == []
    else:
        (message,) = messages
        assert message.id == "django_idempotency.W003"
        assert "'default'" in message.msg and connection.vendor in message.msg
        assert "SILENCED_SYSTEM_CHECKS" in message.hint
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.W003"]):
            assert message.is_silenced()
    with override_settings(DEBUG=True):
        assert check_production_database() == []


def test_w004_no_sweeper_scheduled():
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE={}):
        (message,) = check_sweeper_scheduled()
        assert message.id == "django_idempotency.W004" and SWEEP_TASK in message.msg
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.W004"]):
            assert message.is_silenced()
    scheduled = {"idempotency-sweep": {"task": SWEEP_TASK, "schedule": 3600.0}}
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE=scheduled):
        assert check_sweeper_scheduled() == []
    with override_settings(DEBUG=True, CELERY_BEAT_SCHEDULE={}):
        assert check_sweeper_scheduled() == []
    # without django_celery_beat there is no database schedule to look at
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE={}):
        assert check_sweeper_scheduled_in_database(databases=["default"]) == []


@pytest.mark.parametrize("value", [0, -1, "1MB", 1.5, True, 2**30])
def test_e007_max_response_bytes_out_of_range(value):
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": value}):
        assert ids(check_response_size()) == ["django_idempotency.E007"]


@pytest.mark.parametrize("value", [None, 1, 1024 * 1024, 2**30 - 1])
def test_e007_max_response_bytes_in_range(value):
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": value}):
        assert check_response_size() == []


def test_production_checks_are_registered():
    names = {
        c.__name__ for c in checks.registry.registry.get_checks(include_deployment_checks=True)
    }
    assert {
        "check_production_database",
        "check_sweeper_scheduled",
        "check_sweeper_scheduled_in_database",
        "check_response_size",
    } <= names
