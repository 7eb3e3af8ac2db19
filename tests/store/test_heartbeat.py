"""The automatic heartbeat (``heartbeat=True``, docs/robustness.md): real threads and
sessions on PostgreSQL.

The heartbeat extends a running view's lease from a thread of its own, on its own
connection. It stops as soon as it finds its claim taken over (it could only hold off
nobody), and a dropped connection costs it one beat: it reconnects, so the lease never
runs out under a live view. The three-lease run is in tests/store/test_presence.py.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest

from django_idempotency import signals
from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.faults import admin_connection, terminate, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

URL = "/auto-heartbeat"  # lease 0.6 s: a beat every 0.2 s


def _post(token: str, key: str, **extra: Any) -> Any:
    return token_client(token).post(URL, {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def _heartbeat_alive(record_id: int) -> bool:
    name = f"idempotency-heartbeat-{record_id}"
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_idempotency" and text in r.message]


def test_the_heartbeat_stops_once_its_claim_was_taken_over(gate, caplog):
    """While the view is still running, another attempt takes its claim over: the next
    beat finds it, logs it once at WARNING and the heartbeat thread ends; the view's
    completion is then fenced off (409 ``lease-lost``)."""
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    name, gate_obj = gate
    token = TokenFactory(user__username="beat-stops").key
    key = str(uuid.uuid4())
    runner = Runner()
    try:
        runner.start(lambda: _post(token, key, HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        record = IdempotencyRecord.objects.get(key=key)
        assert _heartbeat_alive(record.pk)
        with admin_connection() as admin:  # a takeover, committed while the view runs
            admin.execute(
                "UPDATE django_idempotency_record SET owner_token = gen_random_uuid() "
                "WHERE id = %s",
                [record.pk],
            )
        wait_for(lambda: not _heartbeat_alive(record.pk), timeout=10)
        assert len(_lines(caplog, "found the claim taken over; stopped")) == 1
        gate_obj.opened.set()
        (response,) = runner.join()
    finally:
        gate_obj.opened.set()
    assert response.status_code == 409
    assert response.json()["type"].endswith("#lease-lost")


def _heartbeat_backend(owner_pid: int) -> int | None:
    """The backend of the heartbeat's own connection (its last statement extended a lease)."""
    with admin_connection() as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND pid <> %s "
            "AND query ILIKE '%%UPDATE django_idempotency_record SET lease_until%%'",
            [owner_pid],
        ).fetchone()
    return None if row is None else int(row[0])


def test_the_heartbeat_reconnects_after_its_connection_dropped(gate, caplog):
    """The heartbeat's session is terminated between two beats (a failover, an idle
    timeout, an operator): the next beat fails and is logged, the one after reconnects
    and extends the lease again, so a duplicate sent long after the first lease would
    have ended still gets 409 and the view completes (201)."""
    from django.db import connection

    from django_idempotency.store import presence

    if not presence.direct(connection):
        pytest.skip("behind a pooler the heartbeat's server session cannot be told apart")
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    name, gate_obj = gate
    token = TokenFactory(user__username="beat-reconnects").key
    key = str(uuid.uuid4())
    kept: list[bool] = []

    def on_beat(sender: str, **kwargs: Any) -> None:
        if kwargs["kept"]:
            kept.append(True)

    signals.extended.connect(on_beat)
    runner = Runner()
    try:
        runner.start(lambda: _post(token, key, HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        wait_for(lambda: kept)
        record = IdempotencyRecord.objects.get(key=key)
        assert record.owner_pid is not None
        terminate(wait_for(lambda: _heartbeat_backend(record.owner_pid)))
        wait_for(lambda: _lines(caplog, "heartbeat could not extend the lease"))
        beats = len(kept)
        wait_for(lambda: len(kept) > beats + 3, timeout=10)  # a lease's worth and more
        duplicate = _post(token, key)
        assert duplicate.status_code == 409  # the lease is alive: not taken over
        gate_obj.opened.set()
        (response,) = runner.join()
    finally:
        gate_obj.opened.set()
        signals.extended.disconnect(on_beat)
    assert response.status_code == 201, response.content
    assert len(_lines(caplog, "heartbeat could not extend the lease")) == 1
