"""``USE_TZ = False`` at the autumn fall-back (Europe/Paris, 2026-10-25): a window that
ends in the repeated hour, in its first or its second pass, ends when real time says
so, on PostgreSQL (docs/storage.md, "Time zones and USE_TZ = False")."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_idempotency import store
from django_idempotency.store import clock
from tests.support.clients import client_for
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


FP = "a" * 64


DAY = 86400.0


LEASE = 30.0


FALL_BACK = dt.datetime(2026, 10, 25, 1, 0, tzinfo=dt.UTC)


@contextmanager
def db_clock_at(moment: dt.datetime) -> Iterator[None]:
    """Put the store's (database's) clock at ``moment`` with the clock offset."""
    before = clock.offset()
    clock.set_offset(before + (moment - dt.datetime.now(dt.UTC)).total_seconds())
    try:
        yield
    finally:
        clock.set_offset(before)


def _scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def _response() -> store.StoredResponse:
    return store.StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')


def partitioned() -> bool:
    from django_idempotency.store.catalog import is_partitioned

    return is_partitioned(connection)


def test_use_tz_false_completion_whose_window_ends_in_the_repeated_hour() -> None:
    """docs/storage.md ("Time zones and USE_TZ = False"): with USE_TZ = False "the store
    never relies on [naive local datetimes] (they are ambiguous in the hour repeated when
    clocks go back): it reads its own times in SQL as UTC ... and passes aware
    datetimes". Leases and retention "follow real elapsed time ... whatever USE_TZ and
    TIME_ZONE are".

    A claim on the partitioned table whose window (24 h) ends in the first pass of that
    hour (00:00-01:00 UTC) is completed by its own completion, and replayed.
    """
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        assert partitioned()
        sc = _scope()
        claim_at = FALL_BACK - dt.timedelta(days=1, minutes=30)  # window ends 00:30 UTC
        with db_clock_at(claim_at):
            won = store.claim(sc, FP, lease=LEASE, retention=DAY)
            assert isinstance(won, store.Claim)
            with transaction.atomic():
                store.complete(won, _response())
            replay = store.claim(sc, FP, lease=LEASE, retention=DAY)
            assert isinstance(replay, store.Existing) and replay.completed
    connections.close_all()


def test_use_tz_false_request_whose_window_ends_in_the_repeated_hour_end_to_end(
    alice: Any,
) -> None:
    """The same through a view (docs/storage.md, "Time zones and USE_TZ = False";
    docs/protocol.md: 409 lease-lost only when "a retry took the claim over").

    ``POST /outcome`` (default 24 h retention) with the database clock at 00:30 UTC the
    day before Europe/Paris falls back: the first request is answered by the view
    (200) and its Widget kept, and retries replay.
    """
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        api = client_for(alice)
        key = str(uuid.uuid4())
        with db_clock_at(FALL_BACK - dt.timedelta(days=1, minutes=30)):
            first = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            second = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            third = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        statuses = [r.status_code for r in (first, second, third)]
        assert statuses[0] == 200, (statuses, first.content)
        assert Widget.objects.filter(name="outcome").count() == 1
        assert second.status_code == 200 and second.headers.get("Idempotent-Replayed") == "true"
        assert third.status_code == 200 and third.headers.get("Idempotent-Replayed") == "true"
    connections.close_all()


def test_use_tz_false_window_ending_in_the_second_pass_of_the_repeated_hour_completes(
    alice: Any,
) -> None:
    """The same request one hour later, its window ending in the second (CET) pass of
    the repeated hour, completes and replays (the pass PostgreSQL picks for an
    ambiguous naive local time)."""
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connections.close_all()
        api = client_for(alice)
        key = str(uuid.uuid4())
        with db_clock_at(FALL_BACK - dt.timedelta(days=1) + dt.timedelta(minutes=30)):
            first = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            second = api.post("/outcome", {"status": 200}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert first.status_code == 200, first.content
        assert second.status_code == 200 and second.headers.get("Idempotent-Replayed") == "true"
    connections.close_all()
