from __future__ import annotations

import uuid

import pytest
from django.test import Client

from tests.factories import UserFactory

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
