"""A view's own 409 and 422 stay apart from the app's (by problem ``type``), and the
bundled client retries only the app's retry-me 409s."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import httpx
import pytest
from django.test import override_settings
from django.utils import timezone

from django_idempotency.client import problem_slug, verdict
from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.scripted_transport import Script, make_client
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.replay_app")]

OWN_BASE = "https://api.example.com/problems/"


def post(client, key, **data):
    return client.post("/x/own", data, format="json", HTTP_IDEMPOTENCY_KEY=key)


def as_httpx(response) -> httpx.Response:
    """A Django test response as the bundled client would see it."""
    return httpx.Response(response.status_code, headers=dict(response.items()),
                          content=response.content)  # fmt: skip


def type_of(response) -> str:
    return json.loads(response.content)["type"]


def test_the_views_own_422_is_stored_and_replayed_with_its_own_type(api, key):
    first = post(api, key, status=422)
    assert first.status_code == 422 and type_of(first) == OWN_BASE + "insufficient-funds"
    again = post(api, key, status=422)
    assert again["Idempotent-Replayed"] == "true" and type_of(again) == type_of(first)
    reused = post(api, key, status=409)  # another body, same key: the app's 422
    assert reused.status_code == 422
    assert type_of(reused) == conf.problem_type_base + "key-reused"
    assert Widget.objects.count() == 1


def test_the_views_own_409_is_released_and_keeps_its_type(api, key):
    first = post(api, key, status=409)
    assert first.status_code == 409 and type_of(first) == OWN_BASE + "name-taken"
    assert "Idempotent-Replayed" not in first
    assert IdempotencyRecord.objects.count() == 0  # 409 releases the key
    assert verdict(as_httpx(first)) == "fail"


def test_the_apps_409_is_retried_and_the_views_is_not(api, key):
    post(api, key, status=422)
    IdempotencyRecord.objects.update(
        state=RecordState.CLAIMED,
        owner_token=uuid.uuid4(),
        response_status=None,
        lease_until=timezone.now() + dt.timedelta(seconds=60),
    )
    in_flight = post(api, key, status=422)
    assert in_flight.status_code == 409
    assert problem_slug(as_httpx(in_flight)) == "request-in-flight"
    assert verdict(as_httpx(in_flight)) == "retry"
    own = post(api, str(uuid.uuid4()), status=409)
    assert verdict(as_httpx(own)) == "fail"


@override_settings(IDEMPOTENCY={"PROBLEM_TYPE_BASE": "urn:acme:problem:"})
def test_a_custom_type_base_is_still_recognised(api, key):
    post(api, key, status=422)
    reused = post(api, key, status=409)
    assert type_of(reused) == "urn:acme:problem:key-reused"
    assert problem_slug(as_httpx(reused)) == "key-reused"


def problem(type_uri: str, status: int = 409) -> httpx.Response:
    body = {"type": type_uri, "title": "t", "status": status, "detail": "d"}
    return httpx.Response(status, headers={"Content-Type": "application/problem+json"},
                          content=json.dumps(body).encode())  # fmt: skip


@pytest.mark.parametrize(
    "type_uri",
    [OWN_BASE + "not-request-in-flight", OWN_BASE + "request-in-flight-v2",
     OWN_BASE + "name-taken", "request-in-flight-but-not"],
)  # fmt: skip
def test_look_alike_view_types_are_not_retried(type_uri):
    assert verdict(problem(type_uri)) == "fail"
    script = Script(problem(type_uri), httpx.Response(201))
    with make_client(script) as client, pytest.raises(Exception, match="409"):
        client.post("/x")
    assert len(script.requests) == 1


@pytest.mark.parametrize(
    "type_uri",
    ["https://django-idempotency.readthedocs.io/en/stable/problems/#request-in-flight",
     "https://api.example.com/p/lease-lost", "urn:acme:problem:request-in-flight"],
)  # fmt: skip
def test_the_apps_retry_me_types_are_retried_whatever_the_base(type_uri):
    assert verdict(problem(type_uri)) == "retry"
