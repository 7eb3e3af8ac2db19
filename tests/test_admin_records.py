"""The record admin as an operator's console: conditions, times (docs/admin.md)."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.test import Client

from django_idempotency import store
from django_idempotency.store import operators
from django_idempotency.testing import travel
from tests.support.factories import UserFactory

BASE = "/admin/django_idempotency/idempotencyrecord/"
FINGERPRINT = "f" * 64


@pytest.fixture
def staff_client() -> Client:
    user = UserFactory(username=f"op-{uuid.uuid4().hex[:8]}", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def claim(lease: float = 30.0, key: str | None = None) -> store.Claim:
    scope = store.Scope("auth.user:1", "POST /jobs", key or str(uuid.uuid4()))
    won = store.claim(scope, FINGERPRINT, lease=lease, retention=86400.0)
    assert isinstance(won, store.Claim)
    return won


def listed(client: Client, keys: list[str], **params: str) -> set[str]:
    page = client.get(BASE, params)
    assert page.status_code == 200
    html = page.content.decode()
    return {key for key in keys if key in html}


def row_text(client: Client, key: str) -> str:
    """The text of the list row that shows ``key``."""
    html = client.get(BASE).content.decode()
    (row,) = [r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if key in r]
    return re.sub(r"<[^>]+>", " ", row)


def test_relative_text_at_fixed_times():
    now = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)
    seconds = dt.timedelta(seconds=1)
    assert operators.relative(now + 42 * seconds, now) == "in 42 s"
    assert operators.relative(now - 59.9 * seconds, now) == "59 s ago"
    assert operators.relative(now - 180 * seconds, now) == "3 min ago"
    assert operators.relative(now + 3599 * seconds, now) == "in 59 min"
    assert operators.relative(now - 7200 * seconds, now) == "2 h ago"
    assert operators.relative(now + 47 * 3600 * seconds, now) == "in 47 h"
    assert operators.relative(now - 3 * 86400 * seconds, now) == "3 d ago"
    assert operators.relative(now + 0.4 * seconds, now) == "now"


@pytest.mark.django_db
def test_the_list_tells_in_flight_abandoned_and_completed_apart(staff_client, api):
    done_key = str(uuid.uuid4())
    assert api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=done_key)
    live = claim(lease=30.0)
    failed = claim(lease=30.0)
    store.advance(failed, "charged")
    assert store.suspend(failed)  # a phased claim that failed after its phase
    keys = [done_key, live.scope.key, failed.scope.key]

    assert listed(staff_client, keys, condition="in-flight") == {live.scope.key}
    assert listed(staff_client, keys, condition="abandoned") == {failed.scope.key}
    assert listed(staff_client, keys, condition="completed") == {done_key}
    # Real time passes between the claim and each page (seconds on a loaded machine);
    # the arithmetic itself is test_relative_text_at_fixed_times's.
    assert re.search(
        r"in flight, lease ends in (1\d|2\d|30) s", row_text(staff_client, live.scope.key)
    )
    failed_row = row_text(staff_client, failed.scope.key)
    assert re.search(r"abandoned, lease ended (now|\d s ago), after phase charged", failed_row)
    assert re.search(r"completed 201, (now|\d s ago)", row_text(staff_client, done_key))

    with travel(75):  # the live claim's lease runs out
        assert listed(staff_client, keys, condition="in-flight") == set()
        assert listed(staff_client, keys, condition="abandoned") == {
            live.scope.key,
            failed.scope.key,
        }
        row = row_text(staff_client, live.scope.key)
        assert re.search(r"abandoned, lease ended (4[4-9]|5\d) s ago", row)
        assert re.search(r"completed 201, 1 min ago", row_text(staff_client, done_key))


@pytest.mark.django_db
def test_an_ended_lease_says_an_operator_ended_it(staff_client):
    stuck = claim(lease=600.0)
    assert store.end_leases([stuck.record_id]) == 1
    row = row_text(staff_client, stuck.scope.key)
    assert "abandoned, lease ended by an operator" in row


@pytest.mark.django_db
def test_the_record_page_shows_times_to_the_second_with_relative_text(staff_client, api, key):
    api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    from django_idempotency.models import IdempotencyRecord

    record = IdempotencyRecord.objects.get(key=key)
    with travel(2 * 3600 + 5):
        html = staff_client.get(f"{BASE}{record.pk}/change/").content.decode()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.search(rf"{stamp} \(completed 2 h ago\)", html)
    assert re.search(rf"{stamp} \(2 h ago\)", html)  # created
    assert re.search(rf"{stamp} \((expires in \d+ h|expired \d+ \w+ ago)\)", html)
    assert "completed 201, 2 h ago" in html
    with travel(40 * 86400):
        html = staff_client.get(f"{BASE}{record.pk}/change/").content.decode()
    assert re.search(rf"{stamp} \(expired \d+ d ago\)", html)


@pytest.mark.postgres
@pytest.mark.django_db
def test_owner_presence_decides_on_postgresql(staff_client):
    """A live lease whose owner's session holds no presence lock is abandoned."""
    from django.db import connection

    from django_idempotency.store.sql import PRESENCE_SEED
    from tests.support.factories import IdempotencyRecordFactory

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    record = IdempotencyRecordFactory(
        lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1), owner_pid=pid
    )
    lock = "hashtextextended(%s || chr(31) || %s || chr(31) || %s, %s)"
    args = [record.principal, record.endpoint, record.key, PRESENCE_SEED]
    keys = [record.key]
    assert listed(staff_client, keys, condition="abandoned") == {record.key}
    assert "abandoned, owner&#x27;s session gone" in staff_client.get(BASE).content.decode()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_lock({lock})", args)
    try:
        assert listed(staff_client, keys, condition="in-flight") == {record.key}
        assert listed(staff_client, keys, condition="abandoned") == set()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_unlock({lock})", args)


# -- The stored body, as a replay sends it ---------------------------------------------


def completed_with(body: bytes, content_type: str) -> store.Claim:
    from django.db import transaction

    won = claim()
    with transaction.atomic():
        store.complete(won, store.StoredResponse(200, [("Content-Type", content_type)], body))
    return won


def viewer(*codenames: str) -> Client:
    from django.contrib.auth.models import Permission

    user = UserFactory(username=f"v-{uuid.uuid4().hex[:8]}", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_body_is_shown_exactly_as_the_replay_sends_it(staff_client, api, key):
    first = api.post("/widgets", {"name": "<b>x</b>", "size": 2}, format="json",
                     HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    replay = api.post("/widgets", {"name": "<b>x</b>", "size": 2}, format="json",
                      HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    assert replay["Idempotent-Replayed"] == "true" and replay.content == first.content
    from django.utils.html import escape

    from django_idempotency.models import IdempotencyRecord

    record = IdempotencyRecord.objects.get(key=key)
    html = staff_client.get(f"{BASE}{record.pk}/change/").content.decode()
    assert f"<pre>{escape(replay.content.decode())}</pre>" in html  # not re-indented
    assert f"application/json, {len(replay.content)} bytes" in html

    unsorted = completed_with(b'{"z": 1,\n "a": [2, 1]}', "application/json")
    html = staff_client.get(f"{BASE}{unsorted.record_id}/change/").content.decode()
    exact = escape('{"z": 1,\n "a": [2, 1]}')
    assert f"<pre>{exact}</pre>" in html  # not re-sorted, not re-indented

    latin = completed_with("café".encode("latin-1"), "text/plain; charset=latin-1")
    html = staff_client.get(f"{BASE}{latin.record_id}/change/").content.decode()
    assert "<pre>café</pre>" in html and "text/plain; charset=latin-1, 4 bytes" in html


@pytest.mark.django_db
def test_a_binary_body_is_a_size_and_a_download_for_those_who_may_see_the_record(staff_client):
    png = b"\x89PNG\r\n\x1a\n\x00\xff\xfe"
    record = completed_with(png, "image/png").record_id
    html = staff_client.get(f"{BASE}{record}/change/").content.decode()
    url = f"{BASE}{record}/body/"
    assert f'image/png, 11 bytes: <a href="{url}">download the body</a>' in html
    assert "<pre>" not in html.split("response body")[-1].split("</div>")[0]

    download = staff_client.get(url)
    assert download.status_code == 200 and download.content == png
    assert download["Content-Type"] == "image/png"
    assert download["Content-Disposition"].startswith("attachment;")
    assert viewer("view_idempotencyrecord").get(url).content == png
    assert viewer("view_outboxmessage").get(url).status_code == 403
    assert Client().get(url).status_code == 302  # to the admin's login
    assert staff_client.get(f"{BASE}{claim().record_id}/body/").status_code == 404  # no body


# -- The principal ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_user_principal_links_to_the_user_for_viewers_who_may_see_users(api, key, alice):
    api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    from django_idempotency.models import IdempotencyRecord

    record = IdempotencyRecord.objects.get(key=key)
    user = alice.user
    assert record.principal == f"auth.user:{user.pk}"  # principals.user_principal's form
    link = f'<a href="/admin/auth/user/{user.pk}/change/">auth.user:{user.pk}</a>'
    may_see_users = viewer("view_idempotencyrecord", "view_user")
    assert link in may_see_users.get(BASE).content.decode()
    assert link in may_see_users.get(f"{BASE}{record.pk}/change/").content.decode()
    cannot = viewer("view_idempotencyrecord").get(BASE).content.decode()
    assert f"auth.user:{user.pk}" in cannot and link not in cannot
    other = claim()
    IdempotencyRecord.objects.filter(pk=other.record_id).update(principal="webhook:stripe")
    listing = may_see_users.get(BASE).content.decode()
    assert "webhook:stripe" in listing and ">webhook:stripe</a>" not in listing


class _LostKeyCodec:
    """A ``BODY_CODEC`` whose key was removed: nothing it stored can be read back."""

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        raise ValueError("the key this body was encrypted with is gone")


@pytest.mark.django_db
def test_a_body_the_codec_cannot_decode_says_why(staff_client):
    from django.conf import settings
    from django.test import override_settings

    record = completed_with(b"{}", "application/json").record_id
    codec = {**getattr(settings, "IDEMPOTENCY", {}), "BODY_CODEC": _LostKeyCodec()}
    with override_settings(IDEMPOTENCY=codec):
        html = staff_client.get(f"{BASE}{record}/change/").content.decode()
    assert "(cannot be decoded by BODY_CODEC: the key this body was encrypted with is gone)" in html


@pytest.mark.django_db
def test_records_can_still_be_deleted_from_the_list(staff_client):
    from django_idempotency.models import IdempotencyRecord

    stuck, done = claim(), completed_with(b"{}", "application/json")
    selected = {"action": "delete_selected", "_selected_action": [stuck.record_id]}
    staff_client.post(BASE, {**selected, "post": "yes"})
    assert not IdempotencyRecord.objects.filter(pk=stuck.record_id).exists()
    assert IdempotencyRecord.objects.filter(pk=done.record_id).exists()


@pytest.mark.django_db
def test_the_list_and_page_show_the_request_path_beside_the_route(staff_client, api, key):
    from django_idempotency.models import IdempotencyRecord
    from tests.support.testapp.models import Widget

    widget = Widget.objects.create(name="box")
    api.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    without = claim()  # claimed without a request: no path
    row = row_text(staff_client, key)
    assert "POST /widgets/{pk}/reboot" in row and f"/widgets/{widget.pk}/reboot " in row
    assert re.search(
        r"POST /jobs\s+(in flight|abandoned)", row_text(staff_client, without.scope.key)
    )
    found = staff_client.get(BASE, {"q": f"/widgets/{widget.pk}/reboot"}).content.decode()
    assert key in found and without.scope.key not in found
    record = IdempotencyRecord.objects.get(key=key)
    page = staff_client.get(f"{BASE}{record.pk}/change/").content.decode()
    assert "Request path" in page and f"/widgets/{widget.pk}/reboot" in page


#: What a retry of the same request gets (``store.judge``), by the condition an
#: operator sees.
_CONDITION_OF = {
    store.Verdict.IN_FLIGHT: operators.IN_FLIGHT,
    store.Verdict.TAKE_OVER: operators.ABANDONED,
    store.Verdict.REPLAY: operators.COMPLETED,
}


@pytest.mark.django_db
def test_a_records_condition_is_what_a_retry_of_its_request_would_get(api):
    """The admin's condition (per row, and as a filter) agrees with ``store.judge``."""
    from django.db import connection

    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.store import clock

    done_key = str(uuid.uuid4())
    assert api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=done_key)
    live = claim(lease=30.0)
    failed = claim(lease=30.0)
    store.advance(failed, "charged")
    assert store.suspend(failed)
    done = IdempotencyRecord.objects.get(key=done_key)
    scopes = [
        live.scope,
        failed.scope,
        store.Scope(done.principal, done.endpoint, done.key),
    ]

    def conditions() -> dict[str, tuple[str, str]]:
        seen = {}
        now = clock.store_now(connection)
        for scope in scopes:
            existing = store.fetch(scope)
            assert existing is not None
            expected = _CONDITION_OF[store.judge(existing, existing.fingerprint)]
            rows = IdempotencyRecord.objects.filter(key=scope.key)
            (record,) = operators.with_condition(rows)
            assert operators.only_condition(rows, expected).exists()
            seen[scope.key] = (expected, operators.condition_of(record, now))
        return seen

    now_seen = conditions()
    assert {key: shown for key, (_, shown) in now_seen.items()} == {
        live.scope.key: operators.IN_FLIGHT,
        failed.scope.key: operators.ABANDONED,
        done_key: operators.COMPLETED,
    }
    assert all(expected == shown for expected, shown in now_seen.values())
    with travel(75):  # the live claim's lease runs out: a retry takes it over
        later = conditions()
    assert later[live.scope.key] == (operators.ABANDONED, operators.ABANDONED)
    assert all(expected == shown for expected, shown in later.values())
