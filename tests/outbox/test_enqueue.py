"""``outbox.enqueue``, the handler registry, the on-commit kick and the outbox admin."""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_idempotency import derive_key, exceptions, outbox
from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.pooled]


def notify(api: Any, key: str, **body: Any) -> Any:
    api.raise_request_exception = False
    return api.post("/notify", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


# enqueue outside views


@pytest.mark.django_db(transaction=True)
def test_enqueue_outside_a_transaction_is_refused():
    with pytest.raises(exceptions.NotInTransaction, match=r"transaction\.atomic\(\)"):
        outbox.enqueue("widget.created", {"id": 1})
    assert OutboxMessage.objects.count() == 0


def test_enqueue_writes_a_pending_message():
    before = timezone.now()
    with transaction.atomic():
        message = outbox.enqueue("widget.created", {"id": 1, "at": before})
    stored = OutboxMessage.objects.get()
    assert stored.pk == message.pk
    assert stored.topic == "widget.created"
    assert stored.payload == {"id": 1, "at": DjangoJSONEncoder().default(before)}
    assert stored.state == OutboxState.PENDING
    assert stored.attempts == 0
    assert stored.record_id is None
    assert re.fullmatch(r"[0-9a-f]{32}", stored.dedup_key)
    assert message.dedup_key == stored.dedup_key
    assert abs((stored.available_at - before).total_seconds()) < 60
    assert stored.available_at == message.available_at
    assert stored.created_at == message.created_at


def test_enqueue_is_idempotent_per_topic_and_dedup_key():
    with transaction.atomic():
        first = outbox.enqueue("a", {"n": 1}, dedup_key="k1")
        again = outbox.enqueue("a", {"n": 2}, dedup_key="k1")
        other_topic = outbox.enqueue("b", {"n": 3}, dedup_key="k1")
        # the transaction is still usable after the conflict
        Widget.objects.create(name="after")
    assert again.pk == first.pk
    assert again.payload == {"n": 1}
    assert other_topic.pk != first.pk
    assert OutboxMessage.objects.count() == 2
    assert Widget.objects.count() == 1


def test_enqueue_later():
    later = timezone.now() + dt.timedelta(hours=1)
    with transaction.atomic():
        message = outbox.enqueue("a", {}, available_at=later)
    assert OutboxMessage.objects.get(pk=message.pk).available_at == later


@pytest.mark.parametrize(
    ("topic", "dedup_key"), [("", None), ("t" * 256, None), ("a", ""), ("a", "k" * 256)]
)
def test_enqueue_validates(topic, dedup_key):
    with transaction.atomic(), pytest.raises(ValueError):
        outbox.enqueue(topic, {}, dedup_key=dedup_key)


def test_enqueue_rolls_back_with_its_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.enqueue("a", {})
        raise RuntimeError
    assert OutboxMessage.objects.count() == 0


# enqueue inside idempotent views


def test_view_messages_link_the_record_and_derive_their_keys(api, alice, key):
    response = notify(api, key)
    assert response.status_code == 201, response.content
    rec = IdempotencyRecord.objects.get(key=key)
    messages = list(OutboxMessage.objects.order_by("id"))
    assert [m.record_id for m in messages] == [rec.pk, rec.pk]
    principal = f"auth.user:{alice.user.pk}"
    assert [m.dedup_key for m in messages] == [
        derive_key(
            principal,
            "POST /notify",
            key,
            f'["outbox", {rec.pk}, "{rec.owner_token}", "", "widget.created", 0]',
        ),
        derive_key(
            principal,
            "POST /notify",
            key,
            f'["outbox", {rec.pk}, "{rec.owner_token}", "", "widget.created", 1]',
        ),
    ]
    assert response.json()["keys"] == [m.dedup_key for m in messages]

    replay = notify(api, key)
    assert replay["Idempotent-Replayed"] == "true"
    assert OutboxMessage.objects.count() == 2


def test_view_that_raises_after_enqueue_leaves_no_message(api, key):
    response = notify(api, key, **{"raise": True})
    assert response.status_code == 500
    assert OutboxMessage.objects.count() == 0
    assert Widget.objects.count() == 0
    assert not IdempotencyRecord.objects.filter(key=key).exists()


def test_view_that_answers_503_after_enqueue_leaves_no_message(api, key):
    assert notify(api, key, status=503).status_code == 503
    assert OutboxMessage.objects.count() == 0


def test_view_that_stores_a_4xx_keeps_its_messages(api, key):
    assert notify(api, key, status=402).status_code == 402
    assert OutboxMessage.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_view_that_raises_after_enqueue_leaves_no_message_committed(api, key):
    """Same, with real commits (no test transaction around it)."""
    with override_settings(IDEMPOTENCY={"OUTBOX_KICK": False}):
        assert notify(api, key, **{"raise": True}).status_code == 500
        assert OutboxMessage.objects.count() == 0
        assert notify(api, key).status_code == 201
    assert OutboxMessage.objects.count() == 2


def test_phase_messages_commit_with_their_phase(api, alice, key):
    HOOKS["crash"] = "after:allocated"
    api.raise_request_exception = False
    api.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    (message,) = OutboxMessage.objects.all()
    owner = IdempotencyRecord.objects.get(pk=message.record_id).owner_token
    name = f'["outbox", {message.record_id}, "{owner}", "allocated", "worker.created", 0]'
    assert message.dedup_key == derive_key(
        f"auth.user:{alice.user.pk}", "POST /provision", key, name
    )
    api.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert OutboxMessage.objects.count() == 1


def test_deleting_a_record_keeps_its_messages(api, key):
    notify(api, key)
    IdempotencyRecord.objects.filter(key=key).delete()
    assert list(OutboxMessage.objects.values_list("record_id", flat=True)) == [None, None]


# registry


def test_register_and_lookup():
    def boot(message: Any, dedup_key: str) -> None:
        pass

    try:
        assert outbox.handler("test.boot")(boot) is boot
        assert outbox.get_handler("test.boot") is boot
        outbox.register("test.boot")(boot)  # the same function again: fine
        with pytest.raises(ValueError, match="already has the handler"):
            outbox.register("test.boot")(lambda m, k: None)
    finally:
        outbox.unregister("test.boot")
    assert outbox.get_handler("test.boot") is None


# the on-commit kick


def test_one_kick_per_transaction(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        for n in range(3):
            outbox.enqueue("a", {"n": n})
    assert len(callbacks) == 1


def test_no_kick_when_disabled(django_capture_on_commit_callbacks):
    with (
        override_settings(IDEMPOTENCY={"OUTBOX_KICK": False}),
        django_capture_on_commit_callbacks() as callbacks,
        transaction.atomic(),
    ):
        outbox.enqueue("a", {})
    assert callbacks == []
    assert outbox.kick() is False


def test_kick_without_a_configured_celery_app_does_nothing():
    from celery import current_app

    assert not current_app.conf.broker_url  # the test settings configure no Celery app
    assert outbox.kick() is False


def test_kick_with_the_broker_down_logs_and_does_not_raise(caplog):
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("broker-down", broker="redis://127.0.0.1:1/0", set_as_current=True)
    app.conf.broker_connection_timeout = 1
    try:
        with caplog.at_level(logging.WARNING, logger="django_idempotency.outbox"):
            assert outbox.kick() is True  # queued for the kicker thread
            assert outbox.wait_for_kicks(60)
    finally:
        previous.set_current()
    assert "outbox relay task not sent, the broker is unavailable" in caplog.text


def test_settings_are_read_at_access_time():
    assert conf.outbox_max_attempts == 25
    with override_settings(
        IDEMPOTENCY={
            "OUTBOX_BATCH_SIZE": 7,
            "OUTBOX_RELAY_LEASE": 30,
            "OUTBOX_MAX_ATTEMPTS": 3,
            "OUTBOX_BACKOFF_BASE": 0.5,
            "OUTBOX_BACKOFF_CAP": 60,
            "OUTBOX_KICK": False,
        }
    ):
        assert conf.outbox_batch_size == 7
        assert conf.outbox_relay_lease == 30.0
        assert conf.outbox_max_attempts == 3
        assert conf.outbox_backoff_base == 0.5
        assert conf.outbox_backoff_cap == 60.0
        assert conf.outbox_kick is False


# admin


@pytest.fixture
def admin_api(client: Any) -> Any:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def make(state: str, n: int = 1, topic: str = "a") -> list[OutboxMessage]:
    return [
        OutboxMessage.objects.create(
            topic=topic, payload={}, dedup_key=f"{state}-{topic}-{i}", state=state, attempts=5
        )
        for i in range(n)
    ]


def run_action(admin_api: Any, action: str, messages: list[OutboxMessage]) -> Any:
    return admin_api.post(
        "/admin/django_idempotency/outboxmessage/",
        {"action": action, "_selected_action": [m.pk for m in messages]},
        follow=True,
    )


def test_admin_lists_and_filters(admin_api):
    make(OutboxState.DEAD, 2, topic="worker.boot")
    make(OutboxState.SENT, 1, topic="mail")
    url = "/admin/django_idempotency/outboxmessage/"
    assert admin_api.get(url).status_code == 200
    dead = admin_api.get(url, {"state": "dead"})
    assert dead.status_code == 200
    assert dead.context["cl"].result_count == 2
    mail = admin_api.get(url, {"topic": "mail"})
    assert mail.context["cl"].result_count == 1
    detail = admin_api.get(f"{url}{OutboxMessage.objects.first().pk}/change/")
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content  # read-only


def test_admin_retry_dead(admin_api):
    dead = make(OutboxState.DEAD, 2)
    sent = make(OutboxState.SENT, 1)
    response = run_action(admin_api, "retry_dead", dead + sent)
    assert "2 dead messages will be retried." in response.content.decode()
    for message in dead:
        message.refresh_from_db()
        assert (message.state, message.attempts) == (OutboxState.PENDING, 0)
        assert message.available_at <= timezone.now() + dt.timedelta(seconds=5)
    sent[0].refresh_from_db()
    assert sent[0].state == OutboxState.SENT

    one = run_action(admin_api, "retry_dead", make(OutboxState.DEAD, 1, topic="b"))
    assert "1 dead message will be retried." in one.content.decode()


def test_admin_purge_sent(admin_api):
    sent = make(OutboxState.SENT, 3)
    pending = make(OutboxState.PENDING, 1)
    response = run_action(admin_api, "purge_sent", sent + pending)
    assert "3 sent messages were purged." in response.content.decode()
    assert list(OutboxMessage.objects.all()) == pending


def test_admin_dead_letter(admin_api):
    pending = make(OutboxState.PENDING, 1)
    response = run_action(admin_api, "dead_letter", pending)
    assert "1 pending message was dead-lettered." in response.content.decode()
    pending[0].refresh_from_db()
    assert pending[0].state == OutboxState.DEAD
