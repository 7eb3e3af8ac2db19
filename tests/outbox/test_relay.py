"""The relay, one process: delivery, retries with backoff, dead letters, the command."""

from __future__ import annotations

import datetime as dt
import io
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_idempotency import outbox, signals
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.clocks import db_now

pytestmark = [pytest.mark.django_db, pytest.mark.pooled]


class Recorder:
    """A handler that records (message id, dedup key, payload) and can be told to fail."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, Any]] = []
        self.fail_with: BaseException | None = None
        self.during: Any = None

    def __call__(self, message: OutboxMessage, dedup_key: str) -> None:
        self.seen.append((message.pk, dedup_key, message.payload))
        if self.during is not None:
            during, self.during = self.during, None
            during(message)
        if self.fail_with is not None:
            raise self.fail_with


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    handler = Recorder()
    outbox.register("test.topic")(handler)
    yield handler
    outbox.unregister("test.topic")


def enqueue(n: int = 1, topic: str = "test.topic", **kwargs: Any) -> list[OutboxMessage]:
    with transaction.atomic():
        return [outbox.enqueue(topic, {"n": i}, **kwargs) for i in range(n)]


def test_delivers_due_messages_and_marks_them_sent(recorder):
    messages = enqueue(3)
    assert relay.deliver_batch() == 3
    assert [(pk, key) for pk, key, _ in recorder.seen] == [(m.pk, m.dedup_key) for m in messages]
    assert [payload for *_, payload in recorder.seen] == [{"n": 0}, {"n": 1}, {"n": 2}]
    for message in OutboxMessage.objects.all():
        assert message.state == OutboxState.SENT
        assert message.attempts == 1
        assert message.sent_at is not None
    assert relay.deliver_batch() == 0
    assert len(recorder.seen) == 3


def test_batch_size_bounds_a_batch(recorder):
    enqueue(5)
    assert relay.deliver_batch(2) == 2
    assert relay.deliver_batch(2) == 2
    assert relay.deliver_batch(2) == 1
    assert OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 5
    with pytest.raises(ValueError):
        relay.deliver_batch(0)


def test_messages_not_yet_due_wait(recorder):
    enqueue(1, available_at=timezone.now() + dt.timedelta(seconds=300))
    assert relay.deliver_batch() == 0
    with travel(301):
        assert relay.deliver_batch() == 1
    assert len(recorder.seen) == 1


def test_order_within_a_batch_is_available_at_then_id(recorder):
    """The documented ordering: (available_at, id) within one batch, nothing more."""
    base = timezone.now() - dt.timedelta(minutes=10)
    late = OutboxMessage.objects.create(
        topic="test.topic", dedup_key="late", available_at=base + dt.timedelta(seconds=2)
    )
    early_b = OutboxMessage.objects.create(
        topic="test.topic", dedup_key="early-b", available_at=base
    )
    early_a = OutboxMessage.objects.create(
        topic="test.topic", dedup_key="early-a", available_at=base
    )
    middle = OutboxMessage.objects.create(
        topic="test.topic", dedup_key="middle", available_at=base + dt.timedelta(seconds=1)
    )
    assert relay.deliver_batch() == 4
    assert [pk for pk, *_ in recorder.seen] == [early_b.pk, early_a.pk, middle.pk, late.pk]


def test_a_retried_message_goes_after_newer_ones(recorder):
    """No FIFO across retries: a failed message waits for its backoff."""
    (first,) = enqueue(1)
    recorder.fail_with = RuntimeError("down")
    assert relay.deliver_batch() == 1
    recorder.fail_with = None
    (second,) = enqueue(1, dedup_key="second")
    with travel(3600):
        assert relay.deliver_batch() == 2
    assert [pk for pk, *_ in recorder.seen] == [first.pk, second.pk, first.pk]


@override_settings(
    IDEMPOTENCY={"OUTBOX_MAX_ATTEMPTS": 4, "OUTBOX_BACKOFF_BASE": 10, "OUTBOX_BACKOFF_CAP": 25}
)
def test_failing_handler_backs_off_then_dead_letters(recorder):
    (message,) = enqueue(1)
    recorder.fail_with = ConnectionError("hypervisor unreachable")
    offset = 0.0
    for attempt, ceiling in [(1, 10), (2, 20), (3, 25)]:
        with travel(offset):
            assert relay.deliver_batch() == 1
            message.refresh_from_db()
            delay = (message.available_at - db_now()).total_seconds()
            assert message.state == OutboxState.PENDING
            assert message.attempts == attempt
            assert "ConnectionError: hypervisor unreachable" in message.last_error
            assert -1 < delay <= ceiling, (attempt, delay)
            if delay > 0.5:
                assert relay.deliver_batch() == 0  # not due before its backoff
        offset += ceiling + 1
    with travel(offset):
        assert relay.deliver_batch() == 1
    message.refresh_from_db()
    assert message.state == OutboxState.DEAD
    assert message.attempts == 4
    with travel(offset + 10**6):
        assert relay.deliver_batch() == 0  # dead messages are never retried
    assert len(recorder.seen) == 4


def test_backoff_grows_exponentially_to_the_cap_with_equal_jitter():
    top = [outbox.backoff(n, base=2, cap=50, rand=lambda: 1.0) for n in range(1, 8)]
    assert top == [2, 4, 8, 16, 32, 50, 50]
    assert outbox.backoff(5, base=2, cap=50, rand=lambda: 0.0) == 16  # half the bound
    assert outbox.backoff(3, base=2, cap=50, rand=lambda: 0.5) == 6
    samples = [outbox.backoff(4, base=2, cap=50) for _ in range(200)]
    assert all(8 <= s <= 16 for s in samples)
    assert len(set(samples)) > 100  # jittered, not a constant


def test_unknown_topic_is_retried_not_lost():
    (message,) = enqueue(1, topic="nobody.listens")
    assert relay.deliver_batch() == 1
    message.refresh_from_db()
    assert message.state == OutboxState.PENDING
    assert "no outbox handler is registered for topic 'nobody.listens'" in message.last_error


def test_stops_at_half_its_lease_and_hands_the_rest_back(recorder):
    enqueue(3)
    assert relay.deliver_batch(lease=0.0) == 0  # no time left: nothing was started
    assert recorder.seen == []
    assert set(OutboxMessage.objects.values_list("state", "attempts")) == {(OutboxState.PENDING, 0)}
    assert relay.deliver_batch() == 3  # handed back due at once


def test_a_relay_whose_lease_ran_out_is_fenced_off(recorder, caplog):
    """While relay A is slow, its lease ends and relay B delivers the message; A's
    late "sent" must not overwrite B's outcome. Delivery is at least once."""
    (message,) = enqueue(1)
    outcomes: list[int] = []

    def second_relay(_message: OutboxMessage) -> None:
        with travel(conf.outbox_relay_lease + 1):
            outcomes.append(relay.deliver_batch())

    recorder.during = second_relay
    assert relay.deliver_batch() == 1
    assert outcomes == [1]
    message.refresh_from_db()
    assert (message.state, message.attempts) == (OutboxState.SENT, 2)
    assert len(recorder.seen) == 2
    assert "taken over by another relay while delivered" in caplog.text


def test_the_relay_command_gives_back_the_previous_sigterm_handler(recorder):
    """A process that runs the command itself (a worker, a scheduler calling
    ``call_command``) keeps its own SIGTERM handling once the command returns."""

    def own(signum: int, frame: Any) -> None:
        raise AssertionError("not called here")

    previous = signal.signal(signal.SIGTERM, own)
    try:
        enqueue(1)
        call_command("idempotency_relay", "--once", stdout=io.StringIO())
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(recorder.seen) == 1


def test_deliver_due_drains_in_batches(recorder):
    enqueue(7)
    assert relay.deliver_due(batch_size=3, max_batches=2) == 6
    assert relay.deliver_due(batch_size=3) == 1


def test_signals_report_lag_failures_and_dead_letters(recorder):
    events: list[tuple[str, dict[str, Any]]] = []

    def listen(name: str) -> Any:
        def receiver(sender: str, **kwargs: Any) -> None:
            events.append((name, {"topic": sender, **kwargs}))

        return receiver

    receivers = {
        "delivered": listen("delivered"),
        "failed": listen("failed"),
        "dead": listen("dead"),
    }
    signals.outbox_delivered.connect(receivers["delivered"])
    signals.outbox_failed.connect(receivers["failed"])
    signals.outbox_dead_lettered.connect(receivers["dead"])
    try:
        enqueue(1)
        relay.deliver_batch()
        with override_settings(IDEMPOTENCY={"OUTBOX_MAX_ATTEMPTS": 2}):
            recorder.fail_with = RuntimeError("x")
            enqueue(1, dedup_key="failing")
            relay.deliver_batch()
            with travel(10**5):
                relay.deliver_batch()
    finally:
        signals.outbox_delivered.disconnect(receivers["delivered"])
        signals.outbox_failed.disconnect(receivers["failed"])
        signals.outbox_dead_lettered.disconnect(receivers["dead"])
    assert [name for name, _ in events] == ["delivered", "failed", "dead"]
    assert events[0][1]["topic"] == "test.topic"
    assert events[0][1]["lag"] >= 0
    assert events[1][1]["attempts"] == 1
    assert events[2][1]["attempts"] == 2


# management command


def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("idempotency_relay", *args, stdout=out)
    return out.getvalue()


def test_command_once_delivers_everything_due(recorder):
    enqueue(5)
    assert run_command("--once", "--batch-size", "2") == (
        "Handled 5 outbox messages.\n5 delivered, 0 failed (retried later), 0 dead-lettered.\n"
    )
    assert OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 5
    assert run_command("--once") == "Handled 0 outbox messages.\n"


def test_command_once_reports_delivered_failed_and_dead_apart(settings):
    """A message whose handler raises is handled, not delivered: the report says which
    were delivered, which failed and will be retried, and which were dead-lettered."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MAX_ATTEMPTS": 2}

    def handler(message: OutboxMessage, key: str) -> None:
        if message.payload["fate"] != "ok":
            raise RuntimeError(message.payload["fate"])

    outbox.register("report.topic")(handler)
    try:
        with transaction.atomic():
            for fate in ("ok", "ok", "fails", "dies"):
                outbox.enqueue("report.topic", {"fate": fate})
        OutboxMessage.objects.filter(payload__fate="dies").update(attempts=1)
        assert run_command("--once") == (
            "Handled 4 outbox messages.\n2 delivered, 1 failed (retried later), 1 dead-lettered.\n"
        )
    finally:
        outbox.unregister("report.topic")
    states = dict(OutboxMessage.objects.values_list("payload__fate", "state"))
    assert states == {"ok": OutboxState.SENT, "fails": OutboxState.PENDING,
                      "dies": OutboxState.DEAD}  # fmt: skip


def test_command_loop_is_bounded_by_max_iterations(recorder):
    enqueue(1)
    output = run_command("--max-iterations", "3", "--interval", "0")
    assert (
        output
        == "Handled 1 outbox message.\n1 delivered, 0 failed (retried later), 0 dead-lettered.\n"
    )
    assert len(recorder.seen) == 1


@pytest.mark.parametrize(
    "args",
    [("--batch-size", "-1"), ("--interval", "-1"), ("--max-iterations", "0"), ("--threads", "0")],
)
def test_command_rejects_bad_arguments(args):
    with pytest.raises(CommandError):
        run_command("--once", *args)
