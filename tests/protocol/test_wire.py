"""Wire behaviour (docs/protocol.md: the header, replays, problems, scope and fingerprint),
through the DRF test client."""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import uuid

import pytest
from django.http import FileResponse
from django.test import override_settings
from django.urls import path
from django.utils import timezone

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.clients import client_for
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.pooled]

PROBLEM = "application/problem+json"


def post(client, url, data=None, key=None, **extra):
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(url, data if data is not None else {}, format="json", **extra)


def problem(response, status, slug):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = json.loads(response.content)
    assert body["status"] == status
    assert body["type"].endswith(slug)
    assert body["title"] and body["detail"]
    assert "Traceback" not in body["detail"]
    return body


def test_replay_is_byte_exact_with_replayable_headers(api, key):
    first = post(api, "/widgets", {"name": "a", "size": 1}, key)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    again = post(api, "/widgets", {"size": 1, "name": "a"}, key)
    assert again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    for header in ("Content-Type", "Location", "ETag"):
        assert again[header] == first[header]
    assert Widget.objects.count() == 1


def test_set_cookie_and_tracing_headers_are_never_replayed(api, key):
    first = post(api, "/widgets", {"name": "a"}, key)
    assert first.cookies["session-ish"].value == "secret"
    assert first["X-Request-ID"] == "req-1"
    record = IdempotencyRecord.objects.get(key=key)
    stored = {name.lower() for name, _ in record.response_headers}
    assert {"content-type", "location", "etag", "x-widget-version"} <= stored
    assert not stored & {"set-cookie", "x-request-id", "date", "content-length"}
    again = post(api, "/widgets", {"name": "a"}, key)
    assert "session-ish" not in again.cookies
    assert "Set-Cookie" not in again
    assert "X-Request-ID" not in again


@override_settings(
    IDEMPOTENCY={"REPLAY_HEADERS": ["X-Widget-Version", "X-Request-ID", "Set-Cookie"]}
)
def test_configured_extra_header_is_replayed_but_forbidden_ones_never(api, key):
    post(api, "/widgets", {"name": "a"}, key)
    again = post(api, "/widgets", {"name": "a"}, key)
    assert again["X-Widget-Version"] == "v7"
    assert "X-Request-ID" not in again
    assert "session-ish" not in again.cookies


def test_missing_key_is_400_and_runs_nothing(api):
    problem(post(api, "/widgets", {"name": "a"}), 400, "missing-key")
    assert Widget.objects.count() == 0


@pytest.mark.parametrize("bad", ["", "a,b", "x" * 256, '"unterminated', "caf\u00e9"])
def test_invalid_key_is_400_and_runs_nothing(api, bad):
    response = api.post(
        "/widgets",
        {"name": "a"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=bad.encode().decode("latin-1"),
    )
    problem(response, 400, "invalid-key")
    assert Widget.objects.count() == 0


def test_both_key_spellings_are_one_key(api):
    first = post(api, "/widgets", {"name": "a"}, '"k-1"')
    again = post(api, "/widgets", {"name": "a"}, "k-1")
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


@override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": 36})
def test_max_key_length_setting(api):
    problem(post(api, "/widgets", {"name": "a"}, "k" * 37), 400, "invalid-key")
    assert post(api, "/widgets", {"name": "a"}, "k" * 36).status_code == 201


def test_optional_key_absent_runs_unprotected_every_time(api):
    assert post(api, "/optional").status_code == 201
    assert post(api, "/optional").status_code == 201
    assert Widget.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0


def test_optional_key_present_is_protected(api, key):
    post(api, "/optional", key=key)
    again = post(api, "/optional", key=key)
    assert again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    retention = (record.expires_at - record.created_at).total_seconds()
    assert retention == pytest.approx(7 * 86400)


@override_settings(IDEMPOTENCY={"REQUIRED": False})
def test_required_setting_is_read_at_request_time(api):
    assert post(api, "/widgets", {"name": "a"}).status_code == 201


def test_safe_methods_are_never_recorded(api, key):
    api.login  # noqa: B018
    for method in ("get", "head", "options"):
        getattr(api, method)("/vs/widgets/", HTTP_IDEMPOTENCY_KEY=key)
    assert IdempotencyRecord.objects.count() == 0


def test_fingerprint_mismatch_is_422(api, key):
    post(api, "/widgets", {"name": "a", "size": 16}, key)
    body = problem(post(api, "/widgets", {"name": "a", "size": 128}, key), 422, "key-reused")
    assert key not in json.dumps(body)
    assert Widget.objects.count() == 1


def test_same_key_on_another_endpoint_is_another_record(api, key):
    assert post(api, "/widgets", {"name": "a"}, key).status_code == 201
    assert post(api, "/optional", key=key).status_code == 201
    assert IdempotencyRecord.objects.filter(key=key).count() == 2


def test_route_pattern_is_the_endpoint_and_path_is_fingerprinted(api, key):
    w1, w2 = Widget.objects.create(name="1"), Widget.objects.create(name="2")
    assert post(api, f"/widgets/{w1.pk}/reboot", key=key).status_code == 200
    problem(post(api, f"/widgets/{w2.pk}/reboot", key=key), 422, "key-reused")
    record = IdempotencyRecord.objects.get(key=key)
    assert record.endpoint == "POST /widgets/{pk}/reboot"
    w2.refresh_from_db()
    assert w2.size == 0


def test_principals_never_see_each_others_records(alice, bob, key):
    a, b = client_for(alice), client_for(bob)
    ra = post(a, "/widgets", {"name": "alice"}, key)
    rb = post(b, "/widgets", {"name": "alice"}, key)
    assert rb.status_code == 201 and "Idempotent-Replayed" not in rb
    assert json.loads(ra.content)["id"] != json.loads(rb.content)["id"]
    assert Widget.objects.count() == 2
    # bob's different body with the same key is no mismatch against alice's
    assert post(b, "/optional", key=key).status_code == 201


def test_anonymous_keyed_request_is_refused(key):
    from rest_framework.test import APIClient

    # A plain Django view has no authentication scheme to challenge: 403.
    problem(post(APIClient(), "/plain", key=key), 403, "no-principal")
    # A DRF view that allows anonymous callers: 401 with the view's challenge.
    response = post(APIClient(), "/anonymous", key=key)
    problem(response, 401, "no-principal")
    assert response["WWW-Authenticate"] == "Token"
    assert Widget.objects.count() == 0
    # Without a key the view runs as DRF allows... unless the key is required (it is).
    problem(post(APIClient(), "/anonymous"), 400, "missing-key")


def test_drf_authentication_runs_before_the_claim(key):
    from rest_framework.test import APIClient

    response = post(APIClient(), "/widgets", {"name": "a"}, key)
    assert response.status_code in (401, 403)
    assert IdempotencyRecord.objects.count() == 0


def test_replay_after_the_resource_was_deleted(api, key):
    widget = Widget.objects.create(name="x")
    first = api.delete(f"/widgets/{widget.pk}", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 204
    again = api.delete(f"/widgets/{widget.pk}", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 204
    assert again["Idempotent-Replayed"] == "true"
    assert (
        api.delete(f"/widgets/{widget.pk}", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())).status_code
        == 404
    )


def test_created_resource_deleted_then_create_replayed(api, key):
    first = post(api, "/widgets", {"name": "a"}, key)
    Widget.objects.all().delete()
    again = post(api, "/widgets", {"name": "a"}, key)
    assert again.content == first.content and again.status_code == 201


@pytest.mark.parametrize("status", [200, 201, 402, 404, 422])
def test_2xx_and_other_4xx_are_stored(api, key, status):
    first = post(api, "/outcome", {"status": status}, key)
    assert first.status_code == status
    again = post(api, "/outcome", {"status": status}, key)
    assert again.status_code == status and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == RecordState.COMPLETED


@pytest.mark.parametrize("status", [500, 503, 408, 409, 425, 429])
def test_release_statuses_roll_back_and_free_the_key(api, key, status):
    assert post(api, "/outcome", {"status": status}, key).status_code == status
    assert Widget.objects.count() == 0  # rolled back
    assert IdempotencyRecord.objects.count() == 0  # released
    again = post(api, "/outcome", {"status": status}, key)
    assert "Idempotent-Replayed" not in again


def test_exception_rolls_back_and_releases(api, key):
    api.raise_request_exception = False
    response = post(api, "/outcome", {"raise": True}, key)
    assert response.status_code == 500
    assert Widget.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0
    retry = post(api, "/outcome", {"status": 201}, key)  # the key is free again
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry


def test_validation_error_releases_so_the_client_can_fix_and_retry(api, key):
    bad = post(api, "/widgets", {"size": 1}, key)  # name missing: DRF raises 400
    assert bad.status_code == 400
    assert IdempotencyRecord.objects.count() == 0
    # same key, corrected body: runs
    assert post(api, "/widgets", {"name": "ok", "size": 1}, key).status_code == 201


@override_settings(IDEMPOTENCY={"RELEASE_PREDICATE": lambda status: status >= 400})
def test_release_predicate_setting(api, key):
    assert post(api, "/outcome", {"status": 402}, key).status_code == 402
    assert IdempotencyRecord.objects.count() == 0


def test_in_flight_duplicate_gets_409_with_retry_after(api, key):
    post(api, "/outcome", {"status": 201}, key)
    # Put the record back in flight: a live claim held by another owner.
    IdempotencyRecord.objects.update(
        state=RecordState.CLAIMED,
        owner_token=uuid.uuid4(),
        response_status=None,
        lease_until=timezone.now() + dt.timedelta(seconds=60),
    )
    body = problem(post(api, "/outcome", {"status": 201}, key), 409, "request-in-flight")
    assert "still being processed" in body["detail"]
    assert post(api, "/outcome", {"status": 201}, key)["Retry-After"] == "1"
    assert Widget.objects.count() == 1
    # a different body while in flight is a mismatch, not a 409
    problem(post(api, "/outcome", {"status": 202}, key), 422, "key-reused")


def test_problem_type_base_setting(api):
    with override_settings(IDEMPOTENCY={"PROBLEM_TYPE_BASE": "https://api.example.com/p/"}):
        body = problem(post(api, "/widgets", {"name": "a"}), 400, "missing-key")
    assert body["type"] == "https://api.example.com/p/missing-key"


def test_viewset_mixin_protects_listed_actions_only(api, key):
    created = post(api, "/vs/widgets/", {"name": "v"}, key)
    assert created.status_code == 201
    assert post(api, "/vs/widgets/", {"name": "v"}, key)["Idempotent-Replayed"] == "true"
    problem(post(api, "/vs/widgets/", {"name": "v"}), 400, "missing-key")
    pk = json.loads(created.content)["id"]
    k2 = str(uuid.uuid4())
    assert post(api, f"/vs/widgets/{pk}/resize/", {"size": 3}, k2).status_code == 200
    assert post(api, f"/vs/widgets/{pk}/resize/", {"size": 3}, k2)["Idempotent-Replayed"] == "true"
    # poke is not in idempotent_actions: unprotected, even with a key
    assert post(api, f"/vs/widgets/{pk}/poke/", key=k2).status_code == 200
    assert post(api, f"/vs/widgets/{pk}/poke/", key=k2).status_code == 200
    assert Widget.objects.filter(name="poke").count() == 2
    # GET through the mixin is untouched
    assert api.get(f"/vs/widgets/{pk}/").status_code == 200
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.expires_at - record.created_at).total_seconds() == pytest.approx(3600)
    assert record.endpoint == "POST /vs/widgets/"
    assert IdempotencyRecord.objects.get(key=k2).endpoint == "POST /vs/widgets/{pk}/resize/"


def test_plain_django_view_with_session_auth(db, key):
    from django.test import Client

    from tests.support.factories import UserFactory

    client = Client()
    client.force_login(UserFactory(username="carol"))
    first = client.post("/plain", {"name": "p"}, HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    again = client.post("/plain", {"name": "p"}, HTTP_IDEMPOTENCY_KEY=key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert client.get("/plain", HTTP_IDEMPOTENCY_KEY=key).status_code == 200
    assert Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.principal.startswith("auth.user:")


def test_streaming_response_is_stored_and_replayed(db, key):
    from django.test import Client

    from tests.support.factories import UserFactory

    client = Client()
    client.force_login(UserFactory(username="dave"))
    first = client.post("/stream", HTTP_IDEMPOTENCY_KEY=key)
    assert b"".join(first.streaming_content if first.streaming else [first.content]) == (
        b"part1,part2"
    )
    again = client.post("/stream", HTTP_IDEMPOTENCY_KEY=key)
    assert again.content == b"part1,part2" and again["Content-Type"] == "text/plain"


OPENED_FILES: list = []


@idempotent
def send_file(request):
    """A view answering a file: Django closes the file when it closes the response."""
    opened = tempfile.TemporaryFile()  # noqa: SIM115  # closed by the response
    opened.write(b"id,name\n1,export\n")
    opened.seek(0)
    OPENED_FILES.append(opened)
    return FileResponse(opened, status=201, content_type="text/csv")


urlpatterns = [path("file", send_file)]


@pytest.mark.urls(__name__)
def test_a_file_response_is_stored_and_its_file_closed(db, key):
    """A ``FileResponse`` is stored, answered as sent and replayed; the file the view
    opened is closed once the response is sent, as Django closes it without the app.

    Relies on Django's ``HttpResponseBase._resource_closers`` (see the contributor docs'
    architecture page)."""
    from django.test import Client

    from tests.support.factories import UserFactory

    OPENED_FILES.clear()
    client = Client()
    client.force_login(UserFactory(username="erin"))
    first = client.post("/file", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    assert b"".join(first.streaming_content if first.streaming else [first.content]) == (
        b"id,name\n1,export\n"
    )
    (opened,) = OPENED_FILES
    assert opened.closed
    again = client.post("/file", HTTP_IDEMPOTENCY_KEY=key)
    assert again.content == b"id,name\n1,export\n" and again["Content-Type"] == "text/csv"
    assert len(OPENED_FILES) == 1


def test_heartbeat_inside_a_test_transaction(api, key):
    """Inside TestCase the claim is uncommitted; the heartbeat still reaches it."""
    response = post(api, "/heartbeat", {}, key)
    assert response.status_code == 201
    assert json.loads(response.content) == {"extended": True}
