"""However the relay stops, what its handlers delivered is marked sent (docs/outbox.md,
"Stopping"): an exception in a handler or in the relay's thread, Ctrl-C, SIGTERM; what
no handler started is handed back, due at once.

The command runs in a real process that gets real signals; each test waits for what
the process reports (a handler entered, the signal handled), never for a time.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import relay
from tests.support.faults import wait_for
from tests.support.relay_process import PENDING, SENT, assert_handed_back, child, enqueue, states

__all__ = ["child"]  # the fixture, used here

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_sigterm_stops_the_relay_after_its_running_handlers_and_marks_them(
    child, settings, threads
):
    """``kill`` (SIGTERM) while handlers run: they finish, every delivered message is
    marked sent, the messages not started are handed back (with a pool, at once, while
    its handlers still run), and the command exits 0."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)
    running = ids[1:2] if threads == "1" else ids[1:3]
    relay_process = child(running, "--threads", threads, "--batch-size", "10")
    for pk in running:
        relay_process.wait_for_line(f"delivered {pk}")
    relay_process.signal(signal.SIGTERM)
    relay_process.wait_for_line(f"signalled {signal.SIGTERM}")
    done = 1 + len(running)
    if threads != "1":  # the relay's thread is free: the rest goes back at once
        wait_for(lambda: set(states(ids[done:])) == {(PENDING, 0)})
    for pk in running:
        relay_process.release(pk)
    assert relay_process.finish() == 0, relay_process.stderr()

    assert f"Handled {done} outbox messages." in relay_process.lines
    assert states(ids[:done]) == [(SENT, 1)] * done
    assert_handed_back(ids[done:])
    # Each delivered once; a pool's handlers finish in any order.
    assert sorted(line for line in relay_process.lines if line.startswith("delivered")) == sorted(
        f"delivered {pk}" for pk in ids[:done]
    )


def test_sigterm_ends_the_wait_between_polls_at_once(child, settings):
    """Caught up and sleeping its ``--interval`` (an hour here), the relay exits 0 as
    soon as it gets SIGTERM, its marks written."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(2)
    relay_process = child([], "--interval", "3600")
    wait_for(lambda: states(ids) == [(SENT, 1)] * 2)
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    assert "Handled 2 outbox messages." in relay_process.lines


def test_a_second_sigterm_stops_the_relay_at_once(child, settings):
    """A handler that does not finish: the second SIGTERM interrupts it. Its message
    stays leased (delivered again after the lease), the one delivered before is
    marked, the rest is handed back, and the command still exits 0."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)
    relay_process = child([ids[1]], "--batch-size", "10")
    relay_process.wait_for_line(f"delivered {ids[1]}")
    relay_process.signal(signal.SIGTERM)
    relay_process.wait_for_line(f"signalled {signal.SIGTERM}")
    relay_process.lines.remove(f"signalled {signal.SIGTERM}")
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    assert states(ids[:2]) == [(SENT, 1), (PENDING, 1)]
    assert_handed_back(ids[2:])


def test_ctrl_c_while_the_relay_waits_on_its_pool_marks_what_the_pool_delivered(child, settings):
    """Ctrl-C (SIGINT) reaches the relay's thread while it waits for its pool: the
    handlers running finish, and the messages they delivered are marked sent, like
    the one delivered before; the messages not started are handed back."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)
    relay_process = child(ids[1:3], "--threads", "2", "--batch-size", "10")
    for pk in ids[1:3]:
        relay_process.wait_for_line(f"delivered {pk}")
    relay_process.signal(signal.SIGINT)
    relay_process.wait_for_line(f"signalled {signal.SIGINT}")
    for pk in ids[1:3]:
        relay_process.release(pk)  # they return while the relay is stopping
    assert relay_process.finish() == 0, relay_process.stderr()

    assert states(ids[:3]) == [(SENT, 1)] * 3
    assert_handed_back(ids[3:])
    assert "Handled 3 outbox messages." in relay_process.lines


@pytest.fixture
def handler() -> Iterator[list[Any]]:
    calls: list[Any] = []
    yield calls
    outbox.unregister("stops.topic")


def test_a_pool_handler_raising_system_exit_leaves_no_delivered_message_unmarked(handler, settings):
    """``sys.exit()`` in one pool handler stops the relay: the handler running beside
    it finishes and its message is marked sent; the messages not started are handed
    back; the one that raised stays leased; ``SystemExit`` propagates."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[0]:
            wait_for(lambda: ids[1] in handler)
            raise SystemExit("stop the worker")
        if message.pk == ids[1]:
            # Returns only once the relay is stopping: the rest was handed back.
            wait_for(lambda: set(states(ids[2:])) == {(PENDING, 0)}, timeout=10)

    outbox.register("stops.topic")(deliver)
    with pytest.raises(SystemExit):
        relay.deliver_batch(10, threads=2)
    assert sorted(handler) == ids[:2]  # two pool threads: either may start first
    assert states(ids[:2]) == [(PENDING, 1), (SENT, 1)]
    assert_handed_back(ids[2:])


def test_a_soft_time_limit_inside_a_handler_stops_the_batch(handler, settings):
    """An exception type in ``stop_on`` (the Celery task passes ``SoftTimeLimitExceeded``)
    raised inside a handler ends the run: that attempt is recorded as failed, the
    delivered message is marked, the rest is handed back, and the exception
    propagates instead of the next handler starting."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)

    class TimeLimit(Exception):
        pass

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[1]:
            raise TimeLimit("soft time limit")

    outbox.register("stops.topic")(deliver)
    with pytest.raises(TimeLimit):
        relay.deliver_due(10, stop_on=(TimeLimit,))
    assert handler == ids[:2]
    assert states(ids[:2]) == [(SENT, 1), (PENDING, 1)]
    assert "soft time limit" in OutboxMessage.objects.get(pk=ids[1]).last_error
    assert_handed_back(ids[2:])


def test_stop_from_another_thread_ends_the_batch_after_the_running_handler(handler, settings):
    """``Relay.stop()``: the running handler finishes and is marked, the rest of the
    batch is handed back, and the relay claims nothing more."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)
    one = relay.Relay()
    entered, proceed = threading.Event(), threading.Event()

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[1]:
            entered.set()
            assert proceed.wait(30)

    outbox.register("stops.topic")(deliver)
    stopper = threading.Thread(target=lambda: (entered.wait(30), one.stop(), proceed.set()))
    stopper.start()
    with one:
        assert one.deliver_batch(10) == 2
        assert one.deliver_batch(10) == 0
    stopper.join(30)
    assert handler == ids[:2]
    assert states(ids[:2]) == [(SENT, 1)] * 2
    assert_handed_back(ids[2:])
