"""django_idempotency.testing, the kit for users' own tests, used on our own view.

``/widgets`` (tests/support/testapp/views.py) is the quick start's view under another name: a
DRF function view with ``@idempotent`` that creates a row and answers 201. The kit's
threads each have their own database connection, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.http import HttpResponse
from django.test import TransactionTestCase
from rest_framework.test import APIClient

from django_idempotency.conf import conf
from django_idempotency.store import clock
from django_idempotency.testing import (
    Duplicates,
    IdempotencyTestMixin,
    fire_duplicates,
    past_lease,
)
from tests.support.clients import client_for
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget


def test_the_fixture_fires_duplicates_that_run_the_view_once(idempotency_kit, alice) -> None:
    burst = idempotency_kit.fire_duplicates(
        lambda: client_for(alice), "/widgets", {"name": "w"}, count=8, format="json"
    )

    original = burst.assert_ran_once()
    assert original.status_code == 201
    assert burst.runs == 1
    assert len(burst.responses) == 8
    assert set(burst.statuses) <= {201, 409}
    assert Widget.objects.count() == 1


def test_the_fixture_fences_a_stale_owner(idempotency_kit, alice) -> None:
    fencing = idempotency_kit.fence_stale_owner(
        lambda: client_for(alice), "/widgets", {"name": "w"}, format="json"
    )

    retry = fencing.assert_fenced()
    assert retry.status_code == 201
    assert fencing.runs == 2  # the stale attempt's view ran too, and was rolled back
    assert Widget.objects.count() == 1
    assert retry["Location"] == f"/widgets/{Widget.objects.get().pk}"


class MixinTests(IdempotencyTestMixin, TransactionTestCase):
    def setUp(self) -> None:
        self.token = TokenFactory(user__username="carol")

    def client_for_carol(self) -> APIClient:
        return client_for(self.token)

    def test_duplicates_run_once(self) -> None:
        burst = self.fire_duplicates(
            self.client_for_carol, "/widgets", {"name": "m"}, count=6, format="json"
        )

        self.assertEqual(self.assertRanOnce(burst).status_code, 201)
        self.assertEqual(Widget.objects.count(), 1)

    def test_stale_owner_is_fenced(self) -> None:
        fencing = self.fence_stale_owner(
            self.client_for_carol, "/widgets", {"name": "m"}, format="json", lease=60
        )

        self.assertFenced(fencing)
        self.assertEqual(Widget.objects.count(), 1)

    def test_a_failed_guarantee_fails_the_test_with_the_answers(self) -> None:
        burst = Duplicates(key="k", responses=(_answer(201), _answer(201)), runs=2)

        with self.assertRaisesRegex(AssertionError, "ran 2 times.*201, 201"):
            self.assertRanOnce(burst)


@pytest.mark.django_db
def test_inside_a_test_transaction_the_kit_says_what_to_use(alice) -> None:
    with pytest.raises(RuntimeError, match="TransactionTestCase"):
        fire_duplicates(lambda: client_for(alice), "/widgets", {"name": "w"}, format="json")


def test_a_request_that_cannot_claim_is_reported(idempotency_kit) -> None:
    # Anonymous: DRF refuses the request before the key is claimed.
    with pytest.raises(AssertionError, match="never claimed: 401"):
        idempotency_kit.fence_stale_owner(APIClient, "/widgets", {"name": "w"}, format="json")


def test_what_the_stale_attempt_raised_is_raised_in_the_test(idempotency_kit, alice) -> None:
    def fail_off_the_main_thread(request) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the view failed")

    HOOKS["during_view"] = fail_off_the_main_thread  # only the held first attempt fails

    with pytest.raises(RuntimeError, match="the view failed"):
        idempotency_kit.fence_stale_owner(
            lambda: client_for(alice), "/widgets", {"name": "w"}, format="json"
        )
    assert Widget.objects.count() == 1  # the retry's


def test_past_lease_moves_the_clock_past_the_lease() -> None:
    before = clock.offset()
    with past_lease():
        assert clock.offset() == before + conf.lease + 1
    with past_lease(300, margin=0.5):
        assert clock.offset() == before + 300.5
    assert clock.offset() == before


# -- the assertions, on answers made by hand ---------------------------------------------


def _answer(status: int, body: bytes = b'{"id": 1}', *, replayed: bool = False) -> HttpResponse:
    response = HttpResponse(body, status=status, content_type="application/json")
    if replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def _problem(slug: str, status: int) -> HttpResponse:
    body = {"type": conf.problem_type_base + slug, "title": slug, "status": status}
    return HttpResponse(json.dumps(body), status=status, content_type="application/problem+json")


def _burst(*responses: HttpResponse, runs: int = 1) -> Duplicates:
    return Duplicates(key=str(uuid.uuid4()), responses=responses, runs=runs)


def test_one_original_replays_and_409s_pass() -> None:
    original = _answer(201)
    burst = _burst(original, _answer(201, replayed=True), _problem("request-in-flight", 409))

    assert burst.assert_ran_once() is original
    assert "view ran 1 time(s)" in burst.summary()
    assert "409 request-in-flight" in burst.summary()


def test_a_stored_business_failure_is_an_original_too() -> None:
    own = HttpResponse(
        json.dumps({"type": "https://api.example.com/out-of-stock"}),
        status=402,
        content_type="application/problem+json",
    )

    assert _burst(own, _answer(402, own.content, replayed=True)).assert_ran_once() is own


@pytest.mark.parametrize(
    ("responses", "runs", "message"),
    [
        ((_answer(201), _answer(201)), 2, "ran 2 times"),
        ((_answer(201), _answer(201)), 1, "2 answers came from the view itself"),
        ((_answer(201), _answer(201, b"{}", replayed=True)), 1, "a replay differs"),
        ((_answer(201), _problem("key-reused", 422)), 1, "unexpected answers: 422 key-reused"),
        ((_answer(201), _problem("store-unavailable", 503)), 1, "503 store-unavailable"),
        ((_problem("request-in-flight", 409),), 1, "0 answers came from the view"),
        ((_answer(201), _answer(201)), 0, "no request claimed the key"),
    ],
)
def test_what_breaks_the_guarantee_is_named(responses, runs, message) -> None:
    with pytest.raises(AssertionError, match=message):
        _burst(*responses, runs=runs).assert_ran_once()


def test_a_503_may_be_allowed_on_sqlite() -> None:
    burst = _burst(_answer(201), _problem("store-unavailable", 503))

    assert burst.assert_ran_once(allow_unavailable=True).status_code == 201


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_503_on_in_memory_sqlite_names_the_fix(monkeypatch, in_memory) -> None:
    """SQLite's in-memory test database fails concurrent writers at once: the 503s of a
    burst there come with the fix (a file name for the test database)."""
    from django.db import connection

    if connection.vendor == "sqlite":
        monkeypatch.setattr(connection, "is_in_memory_db", lambda: in_memory)
    burst = _burst(_answer(201), _problem("store-unavailable", 503))
    with pytest.raises(AssertionError, match="503 store-unavailable") as caught:
        burst.assert_ran_once()
    hinted = "give it a file name" in str(caught.value)
    assert hinted == (connection.vendor == "sqlite" and in_memory)
