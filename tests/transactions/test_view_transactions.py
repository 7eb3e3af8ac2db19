"""What a view does to its own transaction is the view's outcome, not a store failure;
claims made inside a transaction the app did not open are reported."""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client, TestCase
from rest_framework.authtoken.models import Token

from django_idempotency import signals, transactions
from django_idempotency.exceptions import OuterTransactionWarning
from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory, UserFactory
from tests.support.faults import wait_for
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]


@pytest.fixture
def token() -> Any:
    return TokenFactory(user__username="tx")


@pytest.fixture
def ran() -> list[bool]:
    """One entry per run of a test view (its ``_gate`` hook)."""
    runs: list[bool] = []
    HOOKS["during_view"] = lambda request: runs.append(True)
    return runs


@pytest.fixture
def sent() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """The ``store_failed`` and ``released`` signals sent during the test."""
    seen: dict[str, list[dict[str, Any]]] = {"store_failed": [], "released": []}

    def failed(sender: Any, **kwargs: Any) -> None:
        seen["store_failed"].append(kwargs)

    def released(sender: Any, **kwargs: Any) -> None:
        seen["released"].append(kwargs)

    signals.store_failed.connect(failed, weak=False)
    signals.released.connect(released, weak=False)
    yield seen
    signals.store_failed.disconnect(failed)
    signals.released.disconnect(released)


def post(token: Any, path: str, key: str, *, raise_exceptions: bool = False) -> Any:
    client = token_client(token.key)
    client.raise_request_exception = raise_exceptions
    return client.post(path, {}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def assert_nothing_committed(token: Any) -> None:
    assert Widget.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0  # the key was released
    assert list(Token.objects.values_list("key", flat=True)) == [token.key]


# --- A. The view's own transaction outcomes -----------------------------------------


def test_set_rollback_answers_the_views_response_and_releases_the_key(token, ran, sent):
    key = str(uuid.uuid4())
    first = post(token, "/tx/rolls-back", key)
    assert first.status_code == 402 and first.json() == {"detail": "payment required"}
    assert "Idempotent-Replayed" not in first
    assert_nothing_committed(token)
    again = post(token, "/tx/rolls-back", key)  # released: the retry runs the view again
    assert again.status_code == 402 and "Idempotent-Replayed" not in again
    assert len(ran) == 2
    assert sent["store_failed"] == []
    assert [s["status"] for s in sent["released"]] == [402, 402]
    assert_nothing_committed(token)


def test_deferred_constraint_violated_at_commit_is_the_views_exception(token, ran, sent):
    """Every foreign key Django creates is DEFERRABLE INITIALLY DEFERRED (PostgreSQL,
    SQLite): the violation is raised by COMMIT, at the exit of the app's block."""
    key = str(uuid.uuid4())
    with pytest.raises(IntegrityError):
        post(token, "/tx/deferred", key, raise_exceptions=True)
    assert_nothing_committed(token)
    again = post(token, "/tx/deferred", key)  # the view's 500 again, not a 503
    assert again.status_code == 500
    assert len(ran) == 2
    assert sent["store_failed"] == []
    assert [s["status"] for s in sent["released"]] == [None, None]
    assert_nothing_committed(token)


def test_an_uncaught_integrity_error_of_the_view_is_its_exception(token, ran, sent):
    key = str(uuid.uuid4())
    with pytest.raises(IntegrityError):
        post(token, "/tx/integrity", key, raise_exceptions=True)
    assert post(token, "/tx/integrity", key).status_code == 500
    assert len(ran) == 2
    assert sent["store_failed"] == [] and len(sent["released"]) == 2
    assert_nothing_committed(token)


def test_an_error_caught_without_a_savepoint_is_the_views_outcome(
    token, ran, sent, on_postgres, caplog
):
    """On PostgreSQL the caught error aborted the transaction (INERROR): the view's 400
    is answered unstored and the key released. SQLite goes on after a failed statement:
    the transaction commits, the 400 is stored and replayed."""
    key = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = post(token, "/tx/caught", key)
    assert first.status_code == 400 and first.json() == {"detail": "lookup failed"}
    again = post(token, "/tx/caught", key)
    assert again.status_code == 400
    assert sent["store_failed"] == []
    if on_postgres:
        assert "without a savepoint" in caplog.text
        assert "Idempotent-Replayed" not in again and len(ran) == 2
        assert [s["status"] for s in sent["released"]] == [400, 400]
        assert_nothing_committed(token)
    else:
        assert again["Idempotent-Replayed"] == "true" and len(ran) == 1
        assert Widget.objects.count() == 1 and sent["released"] == []


@pytest.mark.postgres
def test_a_streaming_body_that_dooms_the_transaction_is_the_views_outcome(sent):
    """The body is consumed inside the app's transaction: a statement its generator
    caught without a savepoint aborts that transaction there, after the view returned.
    As for a response the view returns with its transaction doomed, the client gets the
    view's response (the body as streamed), unstored, and the key is released; not a
    503."""
    client = Client()
    client.force_login(UserFactory(username="streamer"))
    key = str(uuid.uuid4())
    first = client.post("/tx/streaming-dooms", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 200
    assert b"".join(first.streaming_content if first.streaming else [first.content]) == (
        b"part1,lookup failed"
    )
    assert "Idempotent-Replayed" not in first
    assert sent["store_failed"] == []
    assert [s["status"] for s in sent["released"]] == [200]
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    again = client.post("/tx/streaming-dooms", HTTP_IDEMPOTENCY_KEY=key)  # runs again
    assert again.status_code == 200 and "Idempotent-Replayed" not in again
    assert len(sent["released"]) == 2


def test_a_phase_the_view_rolls_back_commits_nothing_and_stays_pending(token, ran, sent):
    key = str(uuid.uuid4())
    first = post(token, "/tx/phase-rolls-back", key)
    assert first.status_code == 402 and first.json() == {"a_pending": True}
    assert Widget.objects.count() == 0
    record = IdempotencyRecord.objects.get()
    assert record.recovery_point == "" and record.response_status == 402
    again = post(token, "/tx/phase-rolls-back", key)  # stored: the view answered it
    assert again.status_code == 402 and again["Idempotent-Replayed"] == "true"
    assert len(ran) == 1 and sent["store_failed"] == []


# --- B. Claims inside an outer transaction ------------------------------------------


@pytest.fixture
def fresh_warnings() -> Iterator[None]:
    """Every endpoint warns again (the warning is once per endpoint per process)."""
    transactions.reset_warnings()
    yield
    transactions.reset_warnings()


def outer_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, OuterTransactionWarning)]


@pytest.mark.django_db(transaction=False)
def test_atomic_above_idempotent_warns_once_per_endpoint(token, fresh_warnings, caplog):
    with (
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
        pytest.warns(OuterTransactionWarning, match=r"atomic_above \(POST /tx/atomic-above\)"),
    ):
        first = post(token, "/tx/atomic-above", str(uuid.uuid4()))
    assert first.status_code == 201
    assert "transaction.atomic" in caplog.text and "409" in caplog.text
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert post(token, "/tx/atomic-above", str(uuid.uuid4())).status_code == 201
    assert outer_warnings(record) == []  # once per endpoint


@pytest.mark.django_db(transaction=False)
def test_a_with_block_around_the_request_warns(token, fresh_warnings):
    with (
        pytest.warns(OuterTransactionWarning, match="Remove @transaction.atomic"),
        transaction.atomic(),
    ):
        response = post(token, "/widgets", str(uuid.uuid4()))
    assert response.status_code == 400  # no name: the serializer's answer


@pytest.mark.django_db(transaction=False)
def test_no_warning_inside_the_test_cases_own_transaction(token, fresh_warnings):
    """pytest-django's ``db`` wraps the test in atomic blocks Django marks as a test
    case's; neither those nor @transaction.atomic below @idempotent are outer blocks."""
    assert connection.in_atomic_block
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert post(token, "/tx/atomic-below", str(uuid.uuid4())).status_code == 201
        client = Client()
        client.force_login(UserFactory(username="plain-tx"))
        assert client.post("/plain", {}, HTTP_IDEMPOTENCY_KEY="k").status_code == 201
    assert outer_warnings(record) == []


class TestNoWarningUnderDjangoTestCase(TestCase):
    def test_claim_in_a_test_case(self) -> None:
        transactions.reset_warnings()
        token = TokenFactory(user__username="testcase")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            response = post(token, "/tx/atomic-below", str(uuid.uuid4()))
        self.assertEqual(response.status_code, 201)
        self.assertEqual(outer_warnings(record), [])


def test_a_plain_view_under_atomic_warns(fresh_warnings):
    client = Client()
    client.force_login(UserFactory(username="plain-atomic"))
    with pytest.warns(OuterTransactionWarning, match="atomic_above_plain"):
        response = client.post("/tx/atomic-above-plain", {}, HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201


def test_atomic_requests_on_a_view_that_is_not_exempt_warns(token, fresh_warnings, monkeypatch):
    """W001's case at run time: the claim joins the request's transaction."""
    from django.conf import settings

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
    widget = Widget.objects.create(name="r")
    with pytest.warns(OuterTransactionWarning, match="ATOMIC_REQUESTS on the 'default'"):
        response = post(token, f"/widgets/{widget.pk}/reboot", str(uuid.uuid4()))
    assert response.status_code == 200


@pytest.mark.postgres
def test_a_duplicate_waits_out_the_original_inside_an_outer_atomic(token, gate, fresh_warnings):
    """The behaviour the warning and W005 describe: the original's claim is not
    committed, so the duplicate's claim blocks on its row (no 409), then replays."""
    gate_name, held = gate
    key = str(uuid.uuid4())

    def call(gated: bool) -> Any:
        client = token_client(token.key)
        extra = {"HTTP_X_GATE": gate_name} if gated else {}
        return client.post("/tx/atomic-above", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)

    runner = Runner()
    with pytest.warns(OuterTransactionWarning) as record:
        runner.start(lambda: call(gated=True))
        assert held.entered.wait(30)
        runner.start(lambda: call(gated=False))
        # The duplicate waits on the original's uncommitted claim: a row lock, not a 409.
        wait_for(_waiting_on_a_lock)
        held.opened.set()
        first, second = sorted(runner.join(), key=lambda r: "Idempotent-Replayed" in r)
    assert len(outer_warnings(record.list)) == 1  # once for the endpoint
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert held.calls == 1 and Widget.objects.filter(name="atomic-above").count() == 1


def _waiting_on_a_lock() -> bool:
    """Whether a backend waits on a lock in a claim (a row lock, or the advisory lock of
    the day-partitioned table's claim function)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["%django_idempotency%"],
        )
        return bool(cursor.fetchone()[0])
