"""A ``claimed`` signal receiver that raises (docs/observability.md, "Signals").

Receivers run on the request path after the claim committed and before the body runs.
One that raises (a metrics backend down, an audit hook's bug) fails the request, the
``once()`` block or the task with its exception; nothing ran, so the claim is given up:
the key is released (a retry runs at once, on every backend), a taken-over claim of a
phased view keeps its recovery point with its lease ended (a retry resumes it), and no
presence lock is left in the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from django_idempotency import inbox, signals
from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


class ExporterDown(RuntimeError):
    pass


class Receiver:
    """A ``claimed`` receiver that raises while ``broken``; ``calls`` counts its calls."""

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0

    def __call__(self, sender: str, **kwargs: Any) -> None:
        self.calls += 1
        if self.broken:
            raise ExporterDown("the metrics backend is down")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    signals.claimed.connect(receiver)
    yield receiver
    signals.claimed.disconnect(receiver)


def _advisory_locks_of_this_session() -> int:
    """Advisory locks held by this test's session, as another session sees them."""
    if connection.vendor != "postgresql":
        return 0
    from tests.support.faults import admin_connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with admin_connection() as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", [pid]
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_view_whose_claimed_receiver_raises_releases_its_key(receiver):
    """The request fails with the receiver's exception before the view runs, and leaves
    nothing behind; once the receiver works again, the retry runs the view at once
    (201), never a 409 for the rest of the lease."""
    client = token_client(TokenFactory(user__username="receiver-view").key)
    key = str(uuid.uuid4())
    failed = client.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert failed.status_code == 500 and receiver.calls == 1
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0
    assert _advisory_locks_of_this_session() == 0
    receiver.broken = False
    retried = client.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retried.status_code == 201 and Widget.objects.count() == 1


def test_a_phased_takeover_whose_claimed_receiver_raises_keeps_its_recovery_point(receiver):
    """A retry of a phased request that crashed after its first phase takes the claim
    over; its receiver raises, so nothing runs and the claim is kept with its lease
    ended: the next retry resumes after that phase at once, which ran once."""
    receiver.broken = False
    client = token_client(TokenFactory(user__username="receiver-phased").key)
    key = str(uuid.uuid4())
    HOOKS["crash"] = "after:allocated"
    assert client.post("/provision", {}, format="json", HTTP_IDEMPOTENCY_KEY=key).status_code == 500
    receiver.broken = True
    failed = client.post("/provision", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert failed.status_code == 500
    record = IdempotencyRecord.objects.get()
    assert record.recovery_point == "allocated"
    assert _advisory_locks_of_this_session() == 0
    receiver.broken = False
    resumed = client.post("/provision", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert resumed.status_code == 201, resumed.content
    assert Widget.objects.count() == 1  # "allocated" ran once


def _block(key: str) -> Any:
    with inbox.once(key, principal="consumer", endpoint="task:receivers") as attempt:
        if attempt.done:
            return attempt.result
        attempt.result = {"id": Widget.objects.create(name=key).pk}
    return attempt.result


def _call() -> Callable[[str], Any]:
    @inbox.idempotent_call(key="event_id", principal="consumer", endpoint="call:receivers")
    def call(event_id: str) -> Any:
        return {"id": Widget.objects.create(name=event_id).pk}

    return call


def _task() -> Callable[[str], Any]:
    from django_idempotency.inbox.celery import idempotent_task

    @idempotent_task(key="event_id", name="tests.receivers")
    def task(event_id: str) -> Any:
        return {"id": Widget.objects.create(name=event_id).pk}

    return task


@pytest.mark.parametrize("make", [lambda: _block, _call, _task], ids=["once", "call", "task"])
def test_a_block_whose_claimed_receiver_raises_releases_its_key(receiver, make):
    """``once()``, an ``idempotent_call`` function and a Celery ``idempotent_task``
    body keep the same rule as views: the receiver's exception is raised before the
    body runs, and once the receiver works again the retry runs the body at once
    (never ``InFlight`` for the rest of the lease)."""
    run = make()
    with pytest.raises(ExporterDown):
        run("evt-1")
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert _advisory_locks_of_this_session() == 0
    receiver.broken = False
    first = run("evt-1")
    assert first == {"id": Widget.objects.get().pk}
    assert run("evt-1") == first and Widget.objects.count() == 1
