"""A key reused with another request: the 422 names the parts that differ, and only them.

The fingerprint holds a digest of each part (method, path, query, headers, body); the
422 ``key-reused`` says in ``detail`` and in its ``differs`` member which of them differ
from the first request's, and what the server can leave out of the fingerprint.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, RequestFactory, override_settings

from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.digests import LENGTH, PARTS, differing_parts
from django_idempotency.protocol.fingerprint import compute, take
from django_idempotency.store.fingerprints import same_request
from tests.support.factories import UserFactory
from tests.support.testapp.models import Widget

rf = RequestFactory()
JSON = "application/json"


def request(
    method: str = "POST",
    path: str = "/w",
    body: bytes = b'{"a": 1}',
    content_type: str = JSON,
    **headers: str,
) -> Any:
    headers.setdefault("HTTP_X_TENANT", "a")
    return rf.generic(method, path, data=body, content_type=content_type, **headers)


def parts(first: Any, retry: Any, **kw: Any) -> tuple[str, ...]:
    stored, value = compute(first, **kw), compute(retry, **kw)
    assert len(stored) == len(value) == LENGTH
    assert same_request(stored, value) == (differing_parts(stored, value) == ())
    return differing_parts(stored, value)


def test_the_parts_are_method_path_query_headers_and_body_in_that_order():
    assert PARTS == ("method", "path", "query", "headers", "body")


@pytest.mark.parametrize(
    ("retry", "named"),
    [
        (request("PUT"), ("method",)),
        (request(path="/w/2"), ("path",)),
        (request(path="/w?page=2"), ("query",)),
        (request(HTTP_X_TENANT="b"), ("headers",)),
        (request(body=b'{"a": 2}'), ("body",)),
        (request(body=b'{"a": 1}', content_type="application/vnd.x+json"), ("body",)),
        (request("PUT", "/w/2?page=2", b'{"a": 2}', HTTP_X_TENANT="b"), PARTS),
        (request(path="/w?page=1", body=b'{ "a" : 1 }'), ("query",)),
    ],
)
def test_each_differing_part_is_named_and_no_other(retry: Any, named: tuple[str, ...]):
    first = request()
    assert parts(first, retry, headers=["X-Tenant"]) == named


def test_a_retry_that_differs_only_in_what_is_left_out_is_the_same_request():
    first = request(body=b'{"a": 1, "sent_at": 1}', HTTP_X_TENANT="a")
    retry = request(body=b'{"sent_at": 2, "a": 1}', HTTP_X_TENANT="b")
    assert parts(first, retry, exclude=["sent_at"]) == ()  # X-Tenant is not fingerprinted


def test_a_value_that_is_not_a_request_fingerprint_names_no_part():
    other = take(request(path="/w?page=2"))
    assert differing_parts("0" * 64, other.value) == ()  # inbox's payload fingerprint
    assert differing_parts("fp3:" + "A" * (LENGTH - 4), other.value) == ()  # not one
    assert not same_request("0" * 64, other.value)


def test_the_fingerprint_is_ascii_that_the_records_column_holds():
    value = compute(request(path="/é?q=ü", body=b'{"a": "\\ud800"}'))
    column = IdempotencyRecord._meta.get_field("fingerprint").max_length
    assert value.isascii() and value.startswith("fp3:") and len(value) <= column


# Over HTTP, through each kind of view ----------------------------------------------------


def reused(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = json.loads(response.content)
    assert problem["type"].endswith("key-reused")
    return problem


def test_a_drf_view_names_the_body_and_points_at_the_body_exclusions(api: Any, key: str):
    assert api.post("/widgets", {"name": "first-name"}, format="json",
                    HTTP_IDEMPOTENCY_KEY=key).status_code == 201  # fmt: skip
    response = api.post("/widgets", {"name": "second-name"}, format="json",
                        HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    problem = reused(response)
    assert problem["differs"] == ["body"]
    assert "its body differs from the first request's" in problem["detail"]
    assert "FINGERPRINT_EXCLUDE" in problem["detail"]
    assert b"first-name" not in response.content and b"second-name" not in response.content
    assert Widget.objects.count() == 1


def test_a_drf_view_names_the_query_and_the_body_together(api: Any, key: str):
    api.post("/widgets?v=1", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    response = api.post("/widgets?v=2", {"name": "b"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    problem = reused(response)
    assert problem["differs"] == ["query", "body"]
    assert "query string and body differ" in problem["detail"]
    assert "query string always count" in problem["detail"]
    assert b"v=1" not in response.content and b"v=2" not in response.content


def test_one_endpoint_serving_many_resources_names_the_path(api: Any, key: str):
    one, two = Widget.objects.create(name="one"), Widget.objects.create(name="two")
    assert api.post(f"/widgets/{one.pk}/reboot", HTTP_IDEMPOTENCY_KEY=key).status_code == 200
    problem = reused(api.post(f"/widgets/{two.pk}/reboot", HTTP_IDEMPOTENCY_KEY=key))
    assert problem["differs"] == ["path"]
    assert str(two.pk) not in problem["detail"]


@override_settings(IDEMPOTENCY={"FINGERPRINT_HEADERS": ["X-Price-List"]})
def test_a_fingerprinted_header_is_named_with_the_setting_that_makes_it_count(api: Any, key: str):
    api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key,
             HTTP_X_PRICE_LIST="2025")  # fmt: skip
    response = api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key,
                        HTTP_X_PRICE_LIST="2026")  # fmt: skip
    problem = reused(response)
    assert problem["differs"] == ["headers"]
    assert "FINGERPRINT_HEADERS" in problem["detail"] and "2026" not in problem["detail"]


def test_a_blank_query_parameter_is_another_request_than_no_query(api: Any, key: str):
    assert parts(request(path="/w?flag="), request(path="/w")) == ("query",)
    assert parts(request(path="/w?flag="), request(path="/w?flag")) == ()  # both blank
    assert api.post("/widgets?flag=", {"name": "a"}, format="json",
                    HTTP_IDEMPOTENCY_KEY=key).status_code == 201  # fmt: skip
    problem = reused(api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key))
    assert problem["differs"] == ["query"]
    assert Widget.objects.count() == 1


def test_a_plain_django_view_names_the_form_body(db: Any, key: str):
    client = Client()
    client.force_login(UserFactory(username="dora"))
    assert client.post("/plain", {"name": "p"}, HTTP_IDEMPOTENCY_KEY=key).status_code == 201
    problem = reused(client.post("/plain", {"name": "q"}, HTTP_IDEMPOTENCY_KEY=key))
    assert problem["differs"] == ["body"]
    assert "FINGERPRINT_FORM_TOKENS" in problem["detail"]
