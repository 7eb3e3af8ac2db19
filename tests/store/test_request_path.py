"""A record keeps the concrete path its request was sent to (the endpoint is the route)."""

from __future__ import annotations

import uuid

import pytest
from django.test import RequestFactory

from django_idempotency import store
from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.begin import request_path
from tests.support.testapp.models import Widget


def test_the_record_keeps_the_path_beside_its_route(record_table, api, key):
    widget = Widget.objects.create(name="box")
    response = api.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 200
    record = IdempotencyRecord.objects.get(key=key)
    assert record.endpoint == "POST /widgets/{pk}/reboot"
    assert record.request_path == f"/widgets/{widget.pk}/reboot"


def test_the_path_is_kept_percent_encoded_never_with_its_query(record_table, api, key):
    # A NUL, a space, a percent sign and a non-ASCII letter: each stored as sent on the
    # wire, so the database takes it (PostgreSQL refuses NUL in text) and the admin
    # shows it unambiguously.
    sent = "/labels/a%00b%20c%25d%C3%A9"
    response = api.post(f"{sent}?token=secret", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.content
    assert response.json() == {"label": "a\x00b c%dé"}
    assert IdempotencyRecord.objects.get(key=key).request_path == sent


def test_a_long_path_is_cut_to_its_column(record_table, api, key):
    name = "x" * 400
    response = api.post(f"/labels/{name}", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201
    kept = IdempotencyRecord.objects.get(key=key).request_path
    assert len(kept) == 255
    assert kept == f"/labels/{name}"[:252] + "..."


def test_a_replay_and_a_takeover_leave_the_first_path(record_table, api, key):
    widget = Widget.objects.create(name="box")
    first = api.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = api.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert IdempotencyRecord.objects.filter(key=key).count() == 1
    assert IdempotencyRecord.objects.get(key=key).request_path == f"/widgets/{widget.pk}/reboot"


@pytest.mark.django_db
def test_a_claim_without_a_request_keeps_no_path():
    scope = store.Scope("auth.user:1", "POST /jobs", str(uuid.uuid4()))
    won = store.claim(scope, "f" * 64, lease=30.0, retention=60.0)
    assert isinstance(won, store.Claim)
    assert IdempotencyRecord.objects.get(pk=won.record_id).request_path == ""


def test_request_path_includes_the_script_prefix():
    request = RequestFactory().post("/v1/orders/7", SCRIPT_NAME="/api")
    assert request_path(request) == "/api/v1/orders/7"
