"""logs.py: one structured line per decision, never the key above DEBUG."""

from __future__ import annotations

import hashlib
import logging
import uuid

import pytest
from django.db import connection, transaction

from django_idempotency import logs
from django_idempotency.models import IdempotencyRecord
from tests.support.clients import client_for
from tests.support.testapp.gates import HOOKS

pytestmark = pytest.mark.django_db

LOGGER = "django_idempotency.events"
FIELDS = ("event", "endpoint", "principal", "status", "key_hash")


def events(caplog):
    return [r for r in caplog.records if r.name == LOGGER]


def post(api, path, key, data):
    return api.post(path, data, format="json", HTTP_IDEMPOTENCY_KEY=key)


def assert_no_key_above_debug(caplog, key):
    for record in caplog.records:
        if record.levelno >= logging.INFO:
            assert key not in record.getMessage()
            assert all(key not in str(value) for value in vars(record).values())


def test_key_hash_is_short_and_stable():
    key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
    assert logs.key_hash(key) == hashlib.sha256(key.encode()).hexdigest()[:12]
    assert logs.key_hash(key) != logs.key_hash(key + "x")


def test_lifecycle_lines_carry_structured_fields(api, alice, key, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    post(api, "/widgets", key, {"name": "a"})
    post(api, "/widgets", key, {"name": "a"})
    post(api, "/widgets", key, {"name": "b"})
    lines = events(caplog)
    assert [(r.event, r.levelname, r.status) for r in lines] == [
        ("claimed", "DEBUG", None),
        ("completed", "INFO", 201),
        ("replayed", "INFO", 201),
        ("key_reused", "WARNING", 422),
    ]
    for record in lines:
        assert record.endpoint == "POST /widgets"
        assert record.principal == f"auth.user:{alice.user.pk}"
        assert record.key_hash == logs.key_hash(key)
        assert all(hasattr(record, field) for field in FIELDS)
    assert_no_key_above_debug(caplog, key)


def test_in_flight_and_release_lines(api, alice, key, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    def duplicate(request):
        HOOKS.pop("during_view")
        post(client_for(alice), "/widgets", key, {"name": "a"})

    HOOKS["during_view"] = duplicate
    post(api, "/widgets", key, {"name": "a"})
    post(api, "/outcome", str(uuid.uuid4()), {"status": 503})
    api.raise_request_exception = False
    post(api, "/outcome", str(uuid.uuid4()), {"raise": True})
    got = [(r.event, r.status, r.endpoint) for r in events(caplog)]
    assert got == [
        ("in_flight", 409, "POST /widgets"),
        ("completed", 201, "POST /widgets"),
        ("released", 503, "POST /outcome"),
        ("released", None, "POST /outcome"),
    ]
    assert "view raised" in events(caplog)[-1].getMessage()
    assert_no_key_above_debug(caplog, key)


class _Rollback(Exception):
    pass


@pytest.mark.filterwarnings("ignore::django_idempotency.exceptions.OuterTransactionWarning")
def test_store_failure_is_an_error_line_without_the_key(api, key, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    with pytest.raises(_Rollback), transaction.atomic():  # DDL is transactional on both
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME TO django_idempotency_record_gone")
        response = post(api, "/widgets", key, {"name": "a"})
        raise _Rollback
    assert response.status_code == 503
    (error,) = [r for r in events(caplog) if r.levelno == logging.ERROR]
    assert error.event == "store_failed" and error.status == 503
    assert error.key_hash == logs.key_hash(key)
    assert_no_key_above_debug(caplog, key)


def test_takeover_is_a_warning(api, key, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    api.raise_request_exception = False
    HOOKS["crash"] = "after:allocated"
    post(api, "/provision", key, {})
    post(api, "/provision", key, {})
    (warning,) = [r for r in events(caplog) if r.levelno == logging.WARNING]
    assert warning.event == "taken_over" and warning.endpoint == "POST /provision"
    assert warning.cause == "lease" and "lease expired" in warning.getMessage()


def test_a_takeover_says_whether_the_lease_expired_or_an_operator_ended_it(caplog):
    """A ``taken_over`` line names its cause (``cause`` field and message): ``operator``
    after ``operators.end_leases`` (the admin's "End the lease") ended a live lease,
    ``lease`` after the lease ran out by itself. Never "expired" for a lease an operator
    ended."""
    from django_idempotency import store, testing
    from django_idempotency.protocol.decide import decide as _claim
    from django_idempotency.protocol.decisions import Proceed
    from django_idempotency.protocol.digests import Fingerprint
    from django_idempotency.protocol.options import Options
    from django_idempotency.store import operators

    caplog.set_level(logging.WARNING, logger=LOGGER)
    fp = "f" * 64
    options = Options(lease=300)
    ended = store.Scope("ops", "POST /ops", str(uuid.uuid4()))
    held = store.claim(ended, fp, lease=300, retention=3600)
    assert isinstance(held, store.Claim)
    assert operators.end_leases([held.record_id]) == 1
    by_operator = _claim(ended, Fingerprint(fp), options, "default", may_run=True)
    assert isinstance(by_operator, Proceed)
    assert by_operator.claim.takeover_cause == "operator"
    expired = store.Scope("ops", "POST /ops", str(uuid.uuid4()))
    assert isinstance(store.claim(expired, fp, lease=300, retention=3600), store.Claim)
    with testing.travel(301):
        by_lease = _claim(expired, Fingerprint(fp), options, "default", may_run=True)
    assert isinstance(by_lease, Proceed) and by_lease.claim.takeover_cause == "lease"
    first, second = [r for r in events(caplog) if r.event == "taken_over"]
    assert first.cause == "operator" and first.levelno == logging.WARNING
    assert "an operator ended the earlier attempt's lease" in first.getMessage()
    assert "expired" not in first.getMessage()
    assert second.cause == "lease" and "lease expired" in second.getMessage()


@pytest.mark.django_db(transaction=True)
def test_a_lease_an_operator_ended_is_taken_over_for_the_operator_on_every_table(record_table):
    """The claim reads on each kind of record table (the plain table's statement, the
    partitioned table's function, the ORM) that an operator ended the lease: the
    takeover's cause, which its ``taken_over`` line names, is ``operator``, never an
    expired lease."""
    from django_idempotency import store
    from django_idempotency.store import operators

    scope = store.Scope("ops", "POST /ops", str(uuid.uuid4()))
    held = store.claim(scope, "f" * 64, lease=300, retention=3600)
    assert isinstance(held, store.Claim)
    assert operators.end_leases([held.record_id]) == 1
    again = store.claim(scope, "f" * 64, lease=300, retention=3600)
    assert isinstance(again, store.Claim) and again.taken_over, again
    assert again.takeover_cause == store.BY_OPERATOR


def test_disconnect_silences_and_connect_restores(api, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    logs.disconnect()
    try:
        post(api, "/widgets", str(uuid.uuid4()), {"name": "a"})
        assert events(caplog) == []
    finally:
        logs.connect()
    post(api, "/widgets", str(uuid.uuid4()), {"name": "b"})
    assert [r.event for r in events(caplog)] == ["claimed", "completed"]
