"""The on-commit kick with a broker that is down: requests answer as fast as ever, one
warning per outage, and the relay's schedule delivers the messages (docs/outbox.md)."""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory

pytestmark = pytest.mark.django_db(transaction=True)


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def celery_app(broker: str, timeout: float = 1) -> Iterator[Any]:
    """A Celery app on ``broker``, current for the test; ``timeout``: its connection's."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery(f"kick-{uuid.uuid4().hex[:8]}", broker=broker, set_as_current=True)
    app.conf.broker_connection_timeout = timeout
    try:
        yield app
    finally:
        assert outbox.wait_for_kicks(60), "the kicker never finished"
        previous.set_current()


@pytest.fixture
def unreachable_broker() -> Iterator[Any]:
    yield from celery_app(f"redis://127.0.0.1:{closed_port()}/0")


@pytest.fixture
def shipped() -> Iterator[list[Any]]:
    seen: list[Any] = []
    outbox.register("tests.ship")(lambda message, key: seen.append(message.payload["what"]))
    yield seen
    outbox.unregister("tests.ship")


def post(n: int) -> Any:
    client = token_client(TokenFactory(user__username=f"kicker-{uuid.uuid4().hex[:6]}").key)
    return client.post("/ship", {"what": n}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))


def test_requests_answer_with_the_broker_unreachable_and_one_warning_is_logged(
    unreachable_broker, shipped, caplog
):
    """Five requests that enqueue, the broker's port closed: each answers, the outage
    is one warning without traceback (not one per request), and the relay's schedule
    delivers every message."""
    with caplog.at_level(logging.INFO, logger="django_idempotency.outbox"):
        statuses = [post(n).status_code for n in range(5)]
        assert outbox.wait_for_kicks(60)
    assert statuses == [201] * 5
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "outbox relay task not sent, the broker is unavailable" in warnings[0].getMessage()
    assert "delivers the messages" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # no traceback in the log
    assert relay.deliver_due() == 5  # the relay's schedule: beat or idempotency_relay
    assert sorted(shipped) == [0, 1, 2, 3, 4]
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}


class SilentBroker:
    """A loopback server that accepts connections and never answers, until released."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.connected = threading.Event()
        self.released = threading.Event()
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        try:
            while True:
                conn, _ = self.server.accept()
                self.accepted.append(conn)
                self.connected.set()
        except OSError:
            return  # released

    def release(self) -> None:
        self.released.set()
        self.server.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_broker() -> Iterator[SilentBroker]:
    broker = SilentBroker()
    # The backstop: a kick sent from the request would hold it until this fires (its
    # connection's timeout is longer), so the request would answer after the release.
    backstop = threading.Timer(4, broker.release)
    backstop.start()
    apps = celery_app(f"redis://127.0.0.1:{broker.port}/0", timeout=5)
    next(apps)
    try:
        yield broker
    finally:
        backstop.cancel()
        broker.release()
        for _ in apps:  # restores the previous app once the kicker gave up
            pass


def test_a_broker_that_never_answers_does_not_hold_the_request(silent_broker, shipped, caplog):
    """The kick goes to a broker that accepts the connection and never answers. The
    request answers while that connection is still held: the kick is not sent from
    the request's thread."""
    response = post(1)
    assert response.status_code == 201
    assert not silent_broker.released.is_set(), "the request waited for the broker"
    assert silent_broker.connected.wait(30), "no kick reached the broker"
    silent_broker.release()
    assert outbox.wait_for_kicks(60)
    assert relay.deliver_due() == 1
    assert shipped == [1]
