"""SQLite, one process, many threads: the same once-only guarantee (docs/storage.md).

SQLite has one writer at a time, so duplicates queue on its lock instead of racing;
the outcome must still be one execution, every other answer a 409 or a replay.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


def test_16_threads_one_execution():
    token = TokenFactory(user__username="sqlite-racer").key
    for _ in range(5):
        key = str(uuid.uuid4())
        barrier = threading.Barrier(16)
        runner = Runner()

        def client():
            barrier.wait(10)
            return token_client(token).post(
                "/widgets", {"name": "t", "size": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key
            )

        for _ in range(16):
            runner.start(client)
        results = runner.join()
        statuses = sorted(r.status_code for r in results)
        assert Widget.objects.filter(name="t").count() == 1, statuses
        fresh = [r for r in results if r.status_code == 201 and "Idempotent-Replayed" not in r]
        assert len(fresh) == 1, statuses
        assert all(r.status_code in (201, 409) for r in results), statuses
        assert IdempotencyRecord.objects.get(key=key).state == RecordState.COMPLETED
        Widget.objects.all().delete()
