"""A change of the fingerprint settings never turns a byte-identical retry into a 422.

A deploy that adds (or drops) a ``FINGERPRINT_EXCLUDE`` field or a
``FINGERPRINT_HEADERS`` header changes the fingerprint of every request. A record stored
before it still replays a retry sent byte for byte as the first request was, and still
refuses (422 ``key-reused``) a request with another body: a rolling deploy in the middle
of a retry storm sends no client a 422. Each test runs on every kind of record table
(SQLite; PostgreSQL's plain table and its day-partitioned one).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings

from django_idempotency import store
from django_idempotency.protocol import fingerprint
from django_idempotency.protocol.options import Options
from django_idempotency.testing import past_lease
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory, UserFactory
from tests.support.testapp.models import Widget

FIRST = {"name": "a", "sent_at": 1}
OTHER = {"name": "b", "sent_at": 1}

#: (settings the first request is stored under, settings of the retry).
CHANGES = [
    pytest.param({}, {"FINGERPRINT_EXCLUDE": ["sent_at"]}, id="exclude-added"),
    pytest.param({"FINGERPRINT_EXCLUDE": ["sent_at"]}, {}, id="exclude-dropped"),
    pytest.param({}, {"FINGERPRINT_HEADERS": ["X-Price-List"]}, id="header-added"),
    pytest.param({"FINGERPRINT_HEADERS": ["X-Price-List"]}, {}, id="header-dropped"),
    pytest.param(
        {"FINGERPRINT_HEADERS": ["X-Price-List"]},
        {"FINGERPRINT_HEADERS": ["X-Price-List"], "FINGERPRINT_EXCLUDE": ["sent_at"]},
        id="exclude-added-headers-kept",
    ),
]


def post(client: Any, key: str, body: dict[str, Any], price_list: str = "2025") -> Any:
    return client.post(
        "/widgets", body, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_X_PRICE_LIST=price_list
    )


def problem_type(response: Any) -> str:
    assert response["Content-Type"] == "application/problem+json", response.content
    return str(json.loads(response.content)["type"])


@pytest.fixture
def token(record_table: str) -> Any:
    return TokenFactory(user__username="deployer")


@pytest.fixture
def client(token: Any) -> Any:
    return token_client(token.key)


@pytest.mark.parametrize(("before", "after"), CHANGES)
def test_a_byte_identical_retry_replays_a_record_stored_under_other_settings(
    client: Any, key: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    with override_settings(IDEMPOTENCY=before):
        first = post(client, key, FIRST)
    assert first.status_code == 201, first.content

    with override_settings(IDEMPOTENCY=after):
        again = post(client, key, FIRST)
        other = post(client, key, OTHER)

    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert other.status_code == 422 and problem_type(other).endswith("key-reused")
    assert list(Widget.objects.values_list("name", flat=True)) == ["a"]


def test_under_the_same_headers_another_header_value_is_refused_across_an_exclusion_change(
    client: Any, key: str
) -> None:
    """The record holds the headers' digest: only a change of the header names makes
    a record stored before it unable to compare them."""
    headers = {"FINGERPRINT_HEADERS": ["X-Price-List"]}
    with override_settings(IDEMPOTENCY=headers):
        assert post(client, key, FIRST).status_code == 201
    with override_settings(IDEMPOTENCY={**headers, "FINGERPRINT_EXCLUDE": ["sent_at"]}):
        other = post(client, key, FIRST, price_list="2026")
        same = post(client, key, FIRST)

    assert other.status_code == 422 and problem_type(other).endswith("key-reused")
    assert same.status_code == 201 and same["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(("before", "after"), CHANGES)
def test_an_abandoned_claim_stored_under_other_settings_is_taken_over_by_the_same_request(
    client: Any, token: Any, key: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """An attempt claimed the key, then died before its lease ran out; the settings
    changed. The retry of that request takes the claim over once the lease has run
    out (and runs the view); a request with another body is refused."""
    from rest_framework.test import APIRequestFactory

    request = APIRequestFactory().post("/widgets", FIRST, format="json", HTTP_X_PRICE_LIST="2025")
    with override_settings(IDEMPOTENCY=before):
        options = Options()
        stored = fingerprint.compute(
            request,
            exclude=options.get_fingerprint_exclude(),
            headers=options.get_fingerprint_headers(),
        )
    scope = store.Scope(f"auth.user:{token.user.pk}", "POST /widgets", key)
    abandoned = store.claim(scope, stored, lease=5, retention=3600)
    assert isinstance(abandoned, store.Claim)

    with override_settings(IDEMPOTENCY=after), past_lease(5):
        other = post(client, key, OTHER)
        retry = post(client, key, FIRST)

    assert other.status_code == 422 and problem_type(other).endswith("key-reused")
    assert retry.status_code == 201, retry.content
    assert "Idempotent-Replayed" not in retry
    assert list(Widget.objects.values_list("name", flat=True)) == ["a"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({}, {"FINGERPRINT_FORM_TOKENS": []}, id="form-tokens-dropped"),
        pytest.param({}, {"FINGERPRINT_EXCLUDE": ["sent_at"]}, id="exclude-added"),
        pytest.param({"FINGERPRINT_EXCLUDE": ["sent_at"]}, {}, id="exclude-dropped"),
    ],
)
def test_a_byte_identical_form_retry_replays_a_record_stored_under_other_settings(
    record_table: str, key: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    client = Client()
    client.force_login(UserFactory(username="form-deployer"))
    form = {"name": "p", "sent_at": "1", "csrfmiddlewaretoken": "masked-1"}

    with override_settings(IDEMPOTENCY=before):
        first = client.post("/plain", form, HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    with override_settings(IDEMPOTENCY=after):
        again = client.post("/plain", form, HTTP_IDEMPOTENCY_KEY=key)
        other = client.post("/plain", {**form, "name": "q"}, HTTP_IDEMPOTENCY_KEY=key)

    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422 and problem_type(other).endswith("key-reused")
