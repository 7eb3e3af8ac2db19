from __future__ import annotations

import uuid

import pytest
from django.test import Client

from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client():
    user = UserFactory(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def test_changelist_search_filter_and_readonly_detail(staff_client, api):
    key = str(uuid.uuid4())
    api.post("/widgets", {"name": "<b>x</b>", "size": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    from django_idempotency.models import IdempotencyRecord

    record = IdempotencyRecord.objects.get()
    base = "/admin/django_idempotency/idempotencyrecord/"
    listing = staff_client.get(base, {"q": key})
    assert listing.status_code == 200 and key in listing.content.decode()
    assert staff_client.get(base, {"q": "no-such-key"}).content.decode().count(key) == 0
    assert staff_client.get(base, {"state__exact": "completed"}).status_code == 200
    assert staff_client.get(base, {"endpoint": "POST /widgets"}).status_code == 200
    detail = staff_client.get(f"{base}{record.pk}/change/")
    html = detail.content.decode()
    assert detail.status_code == 200
    assert "&lt;b&gt;x&lt;/b&gt;" in html  # the stored body, escaped and pretty-printed
    assert "Location: /widgets/" in html
    assert 'name="_save"' not in html  # read-only
    assert staff_client.get(f"{base}add/").status_code == 403


def _listed(client, keys: list[str], **params) -> set[str]:
    """Which of ``keys`` the record changelist shows with these query parameters."""
    listing = client.get("/admin/django_idempotency/idempotencyrecord/", params)
    assert listing.status_code == 200
    html = listing.content.decode()
    return {key for key in keys if key in html}


def test_filters_list_only_the_matching_records(staff_client):
    import datetime as dt

    from django.utils import timezone

    from django_idempotency.models import RecordState
    from tests.support.factories import IdempotencyRecordFactory

    now = timezone.now()
    before = now - dt.timedelta(days=2)
    claimed = IdempotencyRecordFactory(endpoint="POST /widgets")
    completed = IdempotencyRecordFactory(
        endpoint="POST /orders",
        state=RecordState.COMPLETED,
        response_status=201,
        response_headers=[],
        response_body=b"{}",
        completed_at=now,
    )
    old = IdempotencyRecordFactory(endpoint="POST /widgets", created_at=before)
    keys = [claimed.key, completed.key, old.key]

    assert _listed(staff_client, keys) == set(keys)
    assert _listed(staff_client, keys, state__exact="completed") == {completed.key}
    assert _listed(staff_client, keys, state__exact="claimed") == {claimed.key, old.key}
    assert _listed(staff_client, keys, endpoint="POST /orders") == {completed.key}
    day = {"created_at__year": before.year, "created_at__month": before.month}
    day["created_at__day"] = before.day
    assert _listed(staff_client, keys, **day) == {old.key}
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    since_today = {
        "created_at__gte": today.isoformat(),
        "created_at__lt": (today + dt.timedelta(days=1)).isoformat(),
    }
    assert _listed(staff_client, keys, **since_today) == {claimed.key, completed.key}
