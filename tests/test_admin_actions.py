"""Operators' admin actions: end a lease, forget a stored response (docs/admin.md)."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from django_idempotency import exceptions, store
from django_idempotency.models import IdempotencyRecord, OutboxMessage, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import IdempotencyRecordFactory, TokenFactory, UserFactory
from tests.support.testapp.gates import GATES, Gate
from tests.support.testapp.models import Widget

BASE = "/admin/django_idempotency/idempotencyrecord/"
OUTBOX = "/admin/django_idempotency/outboxmessage/"


def staff(*codenames: str, superuser: bool = False) -> Client:
    user = UserFactory(username=f"op-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.is_superuser = superuser
    user.save()
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, records, *, confirm: bool):
    data = {"action": action, "_selected_action": [r.pk for r in records]}
    if confirm:
        data["post"] = "yes"
    return client.post(BASE, data, follow=confirm)


def live_claim(**kwargs) -> IdempotencyRecord:
    return IdempotencyRecordFactory(lease_until=timezone.now() + dt.timedelta(hours=1), **kwargs)


def completed(**kwargs) -> IdempotencyRecord:
    return IdempotencyRecordFactory(
        state=RecordState.COMPLETED, response_status=201, completed_at=timezone.now(), **kwargs
    )


@pytest.mark.django_db
def test_end_the_lease_asks_first_then_ends_only_live_claims():
    client = staff(superuser=True)
    stuck, other, done = live_claim(), live_claim(recovery_point="leased"), completed()
    page = act(client, "end_leases", [stuck, other, done], confirm=False)
    html = page.content.decode()
    assert page.status_code == 200 and "End the lease" in html
    assert stuck.key in html and other.key in html and done.key not in html
    assert "409 lease-lost" in html and "rolled back" in html  # the consequence, said
    assert "1 other selected record has no live lease" in html
    stuck.refresh_from_db()  # nothing changed yet
    assert stuck.lease_until > timezone.now()
    done_page = act(client, "end_leases", [stuck, other, done], confirm=True)
    messages = [str(m) for m in done_page.context["messages"]]
    assert "2 leases were ended: the next retry with each key takes it over." in messages
    assert "1 selected record did not qualify and was left alone." in messages
    for record in (stuck, other):
        record.refresh_from_db()
        assert record.lease_until <= timezone.now() and record.state == RecordState.CLAIMED
    assert other.recovery_point == "leased"  # a phased claim resumes after its phase


@pytest.mark.django_db
def test_end_the_lease_lists_only_the_leases_it_will_end():
    """A lease that an operator ended already, or that ran out, is not listed for
    confirmation; with nothing to end, the page says so and offers no button."""
    client = staff(superuser=True)
    stuck, ended = live_claim(), live_claim()
    act(client, "end_leases", [ended], confirm=True)
    expired = IdempotencyRecordFactory(lease_until=timezone.now() - dt.timedelta(minutes=5))
    page = act(client, "end_leases", [stuck, ended, expired], confirm=False).content.decode()
    assert stuck.key in page and ended.key not in page and expired.key not in page
    assert "2 other selected records have no live lease" in page
    nothing = act(client, "end_leases", [ended, expired], confirm=False).content.decode()
    assert "None of the selected records has a live lease" in nothing
    assert "nothing will change" in nothing and "Yes, end the leases" not in nothing
    assert ended.key not in nothing and "other selected" not in nothing
    posted = act(client, "end_leases", [ended, expired], confirm=True)  # e.g. a second tab
    messages = [str(m) for m in posted.context["messages"]]
    assert messages == ["No lease was ended: none of the selected records has a live lease."]


@pytest.mark.django_db
def test_the_confirmation_shows_times_as_the_record_pages_do():
    """``2026-12-04 17:43:01 UTC (lease ends in 59 min)``: one format across the admin."""
    client = staff(superuser=True)
    stuck = live_claim()
    page = act(client, "end_leases", [stuck], confirm=False).content.decode()
    stamp = f"{stuck.lease_until:%Y-%m-%d %H:%M:%S} UTC"
    assert re.search(rf"{stamp} \(lease ends in (59|60) min\)", page)
    done = completed()
    page = act(client, "forget_responses", [done], confirm=False).content.decode()
    assert re.search(
        rf"{done.completed_at:%Y-%m-%d %H:%M:%S} UTC \(completed (now|\d s ago)\)", page
    )


@pytest.mark.django_db
def test_end_the_lease_of_one_record_says_so_in_the_singular():
    client = staff(superuser=True)
    page = act(client, "end_leases", [live_claim()], confirm=True)
    messages = [str(m) for m in page.context["messages"]]
    assert messages == ["1 lease was ended: the next retry with its key takes it over."]


@pytest.mark.django_db
def test_the_actions_need_their_permissions():
    viewer = staff("view_idempotencyrecord")
    record = live_claim()
    listing = viewer.get(BASE).content.decode()
    assert "end_leases" not in listing and "forget_responses" not in listing
    viewer.post(BASE, {"action": "end_leases", "_selected_action": [record.pk], "post": "yes"})
    record.refresh_from_db()
    assert record.lease_until > timezone.now()
    operator = staff("view_idempotencyrecord", "change_idempotencyrecord")
    listing = operator.get(BASE).content.decode()
    assert "end_leases" in listing and "forget_responses" not in listing
    assert operator.get(f"{BASE}{record.pk}/change/").context["title"].startswith("View")


@pytest.mark.django_db
def test_ended_lease_lets_the_retry_take_over_and_fences_the_old_owner(api, key):
    first = api.post("/slow", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    # Put the record back in flight, held by a stuck owner with a long lease.
    old = uuid.uuid4()
    IdempotencyRecord.objects.filter(key=key).update(
        state=RecordState.CLAIMED,
        owner_token=old,
        response_status=None,
        lease_until=timezone.now() + dt.timedelta(hours=1),
    )
    record = IdempotencyRecord.objects.get(key=key)
    blocked = api.post("/slow", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert blocked.status_code == 409
    act(staff(superuser=True), "end_leases", [record], confirm=True)
    retry = api.post("/slow", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry  # took over
    scope = store.Scope(record.principal, record.endpoint, record.key)
    stale = store.Claim(scope, record.pk, old, False, "", "default")
    with pytest.raises(exceptions.LeaseLost):
        store.complete(stale, store.StoredResponse(201, [], b"{}"))


@pytest.mark.django_db
def test_forget_the_stored_response_says_the_consequence_then_the_key_runs_again(api, key):
    first = api.post("/notify", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    record, claim = IdempotencyRecord.objects.get(key=key), live_claim()
    client = staff(superuser=True)
    page = act(client, "forget_responses", [record, claim], confirm=False)
    html = page.content.decode()
    assert page.status_code == 200 and record.key in html and claim.key not in html
    assert "a second time" in html  # the consequence, said
    done = act(client, "forget_responses", [record, claim], confirm=True)
    messages = [str(m) for m in done.context["messages"]]
    assert (
        "1 stored response was forgotten: the next request with its key runs the view again."
        in messages
    )
    assert IdempotencyRecord.objects.filter(pk=claim.pk).exists()  # claims are left alone
    assert OutboxMessage.objects.filter(record__isnull=True).count() == 2  # kept, unlinked
    again = api.post("/notify", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Widget.objects.filter(name="notify").count() == 2


@pytest.mark.django_db
def test_outbox_message_links_to_its_record_and_pages_are_views(api, key):
    api.post("/notify", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    record = IdempotencyRecord.objects.get(key=key)
    message = OutboxMessage.objects.filter(record=record).first()
    client = staff(superuser=True)
    page = client.get(f"{OUTBOX}{message.pk}/change/")
    html = page.content.decode()
    assert f'href="{BASE}{record.pk}/change/"' in html
    assert page.context["title"] == "View outbox message"
    detail = client.get(f"{BASE}{record.pk}/change/")
    assert detail.context["title"] == "View idempotency record"
    assert f"{OUTBOX}?record__id__exact={record.pk}" in detail.content.decode()
    messages = client.get(OUTBOX, {"record__id__exact": record.pk})
    assert messages.status_code == 200 and messages.context["title"].endswith("to view")
    assert set(messages.context["cl"].result_list) == set(record.outbox_messages.all())
    IdempotencyRecord.objects.filter(pk=record.pk)._raw_delete("default")  # swept
    assert "no longer exists" in client.get(f"{OUTBOX}{message.pk}/change/").content.decode()


@pytest.mark.django_db
def test_lists_show_few_columns():
    client = staff(superuser=True)
    live_claim(key="k" * 200)
    listing = client.get(BASE)
    assert len(listing.context["cl"].list_display) <= 6  # checkbox + 5
    assert f">{'k' * 39}…</a>" in listing.content.decode()  # the full key on the detail page
    assert len(client.get(OUTBOX).context["cl"].list_display) <= 7


# -- A real concurrent owner (PostgreSQL) ---------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_end_the_lease_of_a_running_owner_over_http():
    """The owner holds its claim mid-flight; an operator ends the lease; the retry takes
    over and completes; the owner's completion is fenced (409 lease-lost, rolled back)."""
    token = TokenFactory(user__username="owner").key
    key, gate_name = str(uuid.uuid4()), uuid.uuid4().hex
    gate = GATES[gate_name] = Gate()
    runner = Runner()
    try:
        runner.start(
            lambda: token_client(token).post(
                "/slow", {"name": "job"}, format="json",
                HTTP_IDEMPOTENCY_KEY=key, HTTP_X_GATE=gate_name,
            )
        )  # fmt: skip
        assert gate.entered.wait(30), "the owner never reached the view"
        record = IdempotencyRecord.objects.get(key=key)
        assert record.state == RecordState.CLAIMED
        busy = token_client(token).post("/slow", {"name": "job"}, format="json",
                                        HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
        assert busy.status_code == 409  # the live lease holds duplicates off
        page = act(staff(superuser=True), "end_leases", [record], confirm=True)
        assert "1 lease was ended" in str(next(iter(page.context["messages"])))
        retry = token_client(token).post("/slow", {"name": "job"}, format="json",
                                         HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    finally:
        gate.opened.set()
    (owner,) = runner.join()
    assert owner.status_code == 409
    assert owner.json()["type"].endswith("lease-lost")
    assert "or an operator ended the lease" in owner.json()["detail"]  # the cause, named
    assert Widget.objects.filter(name="job").count() == 1  # the owner's write rolled back
    record.refresh_from_db()
    assert record.state == RecordState.COMPLETED
    replay = token_client(token).post("/slow", {"name": "job"}, format="json",
                                      HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    assert replay["Idempotent-Replayed"] == "true" and replay.content == retry.content
    del GATES[gate_name]


# -- Outbox actions and list -----------------------------------------------------------


def _messages(*states: str) -> list[OutboxMessage]:
    from django.db import transaction

    from django_idempotency import outbox

    made = []
    for i, state in enumerate(states):
        with transaction.atomic():
            message = outbox.enqueue("admin.topic", {"i": i}, dedup_key=f"{state}-{i}")
        OutboxMessage.objects.filter(pk=message.pk).update(state=state, attempts=3)
        made.append(OutboxMessage.objects.get(pk=message.pk))
    return made


@pytest.mark.django_db
def test_retry_dead_says_which_selected_messages_were_left_alone_and_why():
    client = staff(superuser=True)
    dead, sent, pending, sent_too = _messages("dead", "sent", "pending", "sent")
    page = client.post(
        OUTBOX,
        {"action": "retry_dead", "_selected_action": [dead.pk, sent.pk, pending.pk, sent_too.pk]},
        follow=True,
    )
    messages = [str(m) for m in page.context["messages"]]
    assert messages == [
        "1 dead message will be retried.",
        "2 selected messages were left alone: they were sent already.",
        "1 selected message was left alone: it is pending (the relay delivers it when due).",
    ]
    dead.refresh_from_db()
    sent.refresh_from_db()
    assert (dead.state, dead.attempts) == ("pending", 0)
    assert (sent.state, sent.attempts) == ("sent", 3)


@pytest.mark.django_db
def test_a_sent_message_shows_no_due_time():
    client = staff(superuser=True)
    sent, _pending = _messages("sent", "pending")
    listing = client.get(OUTBOX)
    rows = {row.pk: row for row in listing.context["cl"].result_list}
    admin_obj = listing.context["cl"].model_admin
    assert admin_obj.due(rows[sent.pk]) == "—"
    page = client.get(f"{OUTBOX}{sent.pk}/change/").content.decode()
    assert "Available at" in page and "—" in page


@pytest.mark.django_db
def test_outbox_times_read_as_the_record_pages_do():
    """To the second in UTC with the relative time, in the list and on the page."""
    client = staff(superuser=True)
    (pending,) = _messages("pending")
    OutboxMessage.objects.filter(pk=pending.pk).update(
        available_at=timezone.now() + dt.timedelta(minutes=3, seconds=30)
    )
    pending.refresh_from_db()
    listing = client.get(OUTBOX).content.decode()
    due = f"{pending.available_at:%Y-%m-%d %H:%M:%S} UTC (due in 3 min)"
    created = f"{pending.created_at:%Y-%m-%d %H:%M:%S} UTC ("
    assert due in listing and created in listing
    page = client.get(f"{OUTBOX}{pending.pk}/change/").content.decode()
    assert due in page and created in page
