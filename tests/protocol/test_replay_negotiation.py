"""A replay is the stored representation, whatever the retry's ``Accept`` (docs/faq.md)."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from django.utils import timezone

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store.sql import presence_key
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.replay_app")]

UNRENDERABLE = "application/xml"
#: One protected view per way of protecting it.
VIEWS = {
    "below @api_view": ("/x/export", {}),
    "above @api_view": ("/x/gzip", {}),
    "IdempotentMixin": ("/x/receipt", {"name": "r"}),
    "ViewSet action (mixin)": ("/vs/widgets/", {"name": "v"}),
    "method with ReplayNegotiation": ("/x/method", {}),
}


def post(client, url, key, data=None, accept=None):
    extra = {"HTTP_ACCEPT": accept} if accept else {}
    return client.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def _documented_setup(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """DRF before 3.17 needs ``ReplayNegotiation`` for ``@idempotent`` below ``@api_view``
    (docs/protocol.md): ``DEFAULT_CONTENT_NEGOTIATION_CLASS``, which DRF reads when it
    defines ``APIView``, long before a test could override the setting. So the test sets
    what that setting gives the view's class; other ways, and newer DRF, need nothing."""
    import rest_framework

    from django_idempotency.protocol.drf import ReplayNegotiation
    from tests.support import replay_app

    version = tuple(int(part) for part in rest_framework.VERSION.split(".")[:2])
    if way == "below @api_view" and version < (3, 17):
        monkeypatch.setattr(replay_app.export.cls, "content_negotiation_class", ReplayNegotiation)


@pytest.mark.parametrize("way", VIEWS)
def test_a_retry_no_renderer_fits_gets_the_stored_representation(api, key, way, monkeypatch):
    _documented_setup(way, monkeypatch)
    url, data = VIEWS[way]
    first = post(api, url, key, data, accept="application/json")
    assert first.status_code == 201
    again = post(api, url, key, data, accept=UNRENDERABLE)
    assert again.status_code == 201, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert Widget.objects.count() == 1


@pytest.mark.parametrize("way", VIEWS)
def test_a_first_request_no_renderer_fits_is_still_406_and_claims_nothing(api, key, way):
    url, data = VIEWS[way]
    response = post(api, url, key, data, accept=UNRENDERABLE)
    assert response.status_code == 406
    assert IdempotencyRecord.objects.count() == 0
    assert Widget.objects.count() == 0
    assert post(api, url, key, data).status_code == 201  # the key is still free


def test_a_retry_asking_for_another_renderable_format_gets_the_stored_json(api, key):
    first = post(api, "/x/receipt", key, {"name": "r"}, accept="application/json")
    again = post(api, "/x/receipt", key, {"name": "r"}, accept="text/html")
    assert again["Idempotent-Replayed"] == "true"
    assert again["Content-Type"] == "application/json" and again.content == first.content


def test_no_renderer_fits_and_another_body_is_still_422(api, key):
    post(api, "/x/receipt", key, {"name": "r"})
    response = post(api, "/x/receipt", key, {"name": "other"}, accept=UNRENDERABLE)
    assert response.status_code == 422
    assert json.loads(response.content)["type"].endswith("key-reused")


def turn_into_claim(
    using: str = "default", *, lease_seconds: float = 60, owner_pid: int | None = None
) -> IdempotencyRecord:
    """The one completed record on ``using`` turned back into a claim of another owner,
    its lease ending in ``lease_seconds`` (negative: over), its owner's session
    ``owner_pid``."""
    IdempotencyRecord.objects.using(using).update(
        state=RecordState.CLAIMED,
        owner_token=uuid.uuid4(),
        response_status=None,
        lease_until=timezone.now() + dt.timedelta(seconds=lease_seconds),
        owner_pid=owner_pid,
    )
    return IdempotencyRecord.objects.using(using).get()


def claimed_again(api, key, *, lease_seconds: float, owner_pid: int | None = None):
    """``key`` used once on /x/receipt, its record then another owner's claim."""
    post(api, "/x/receipt", key, {"name": "r"})
    return turn_into_claim(lease_seconds=lease_seconds, owner_pid=owner_pid)


def test_after_a_crashed_claim_no_renderer_fits_and_another_body_is_still_422(api, key):
    """A crashed attempt left a claim whose lease ran out. A retry with another body
    whose ``Accept`` no renderer fits is a key reused (422), as it is with any
    ``Accept``: only a retry of the same request could take the claim over, and that
    one would have to run the view, so it gets DRF's 406 and claims nothing."""
    claimed_again(api, key, lease_seconds=-60)
    other = post(api, "/x/receipt", key, {"name": "other"}, accept=UNRENDERABLE)
    assert other.status_code == 422, other.content
    assert json.loads(other.content)["type"].endswith("key-reused")
    same = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert same.status_code == 406
    assert IdempotencyRecord.objects.get().state == RecordState.CLAIMED  # not taken over


def test_no_renderer_fits_while_in_flight_is_409(api, key):
    claimed_again(api, key, lease_seconds=60)
    response = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert response.status_code == 409
    assert json.loads(response.content)["type"].endswith("request-in-flight")


#: A PostgreSQL backend process id no session has (``max_pid`` is far below it), so it
#: holds no presence lock: the owner's session that recorded it is gone.
GONE_PID = 2**31 - 1


@pytest.mark.postgres
def test_no_renderer_fits_after_the_owner_is_gone_is_406_and_takes_nothing_over(api, key):
    """A claim whose lease is live but whose owner's session is gone (owner presence) is
    one a retry of the same request takes over. A retry that cannot run the view gets
    what a new key gets, DRF's 406, not a 409 that would repeat until the lease ends;
    the retry that can run the view then takes the claim over."""
    claimed = claimed_again(api, key, lease_seconds=60, owner_pid=GONE_PID)

    unrenderable = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)

    assert unrenderable.status_code == 406, unrenderable.content
    assert IdempotencyRecord.objects.get().owner_token == claimed.owner_token  # untouched
    retry = post(api, "/x/receipt", key, {"name": "r"})
    assert retry.status_code == 201, retry.content
    assert IdempotencyRecord.objects.get().state == RecordState.COMPLETED


@pytest.mark.postgres
def test_no_renderer_fits_while_a_present_owner_runs_is_409(api, key):
    """The owner's session holds its presence lock: the claim is in flight for every
    retry, whatever its ``Accept``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own_pid,) = cursor.fetchone()
    record = claimed_again(api, key, lease_seconds=60, owner_pid=own_pid)
    scope = {"principal": record.principal, "endpoint": record.endpoint, "key": record.key}
    with connection.cursor() as cursor:  # this session is the owner: it holds the lock
        cursor.execute(f"SELECT pg_advisory_lock({presence_key()})", scope)
    try:
        response = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_unlock({presence_key()})", scope)

    assert response.status_code == 409
    assert json.loads(response.content)["type"].endswith("request-in-flight")


def test_authentication_still_runs_before_a_replay(api, key):
    from rest_framework.test import APIClient

    post(api, "/x/receipt", key, {"name": "r"})
    response = post(APIClient(), "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert response.status_code in (401, 403)
    assert "Idempotent-Replayed" not in response


def test_an_unprotected_view_keeps_drfs_406(api, key):
    response = api.get("/vs/widgets/", HTTP_ACCEPT=UNRENDERABLE, HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 406
