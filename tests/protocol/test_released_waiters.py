"""Duplicates waiting (``wait=``) on an original that fails and releases its claim:
one of them runs the view once more, the others get its replay, on PostgreSQL
(docs/protocol.md, "Bounded wait")."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.db import connection

from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


def _waiting_advisory_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(cursor.fetchone()[0])


@URLS
def test_waiters_of_a_released_original_run_the_view_once_more_and_replay_it(alice: Any) -> None:
    """docs/protocol.md "Bounded wait": with wait=, "the original fails and releases the
    key: the duplicate claims it and runs the view"; exactly one of the woken duplicates
    runs it (claim = insert against the unique scope), the others get its replay."""
    import time

    from tests.support.concurrency import Runner, token_client
    from tests.support.response_views import FLAKY

    FLAKY.update(runs=0, lock=threading.Lock(), entered=threading.Event(), open=threading.Event())
    key = str(uuid.uuid4())

    def post() -> Any:
        return token_client(alice.key).post(
            "/responses/flaky-wait", {}, format="json", HTTP_IDEMPOTENCY_KEY=key
        )

    runner = Runner()
    try:
        runner.start(post)
        assert FLAKY["entered"].wait(30)
        for _ in range(4):
            runner.start(post)
        deadline = time.monotonic() + 30
        while _waiting_advisory_locks() < 4:  # every duplicate queued on the owner's lock
            assert time.monotonic() < deadline, "duplicates never queued"
            time.sleep(0.01)
    finally:
        FLAKY["open"].set()
    results = runner.join()
    statuses = sorted(r.status_code for r in results)
    assert statuses == [201, 201, 201, 201, 503], statuses
    replayed = [r for r in results if r.headers.get("Idempotent-Replayed") == "true"]
    assert len(replayed) == 3
    assert FLAKY["runs"] == 2
    assert list(Widget.objects.values_list("name", flat=True)) == ["flaky-2"]
