"""Database faults: the key store unreachable, or its connection killed mid-flight.

What must hold (docs/robustness.md):

* fail closed: a 503 problem with ``Retry-After``; the view never runs without a claim;
* nothing half-written: no business row without a completed record, and no completed
  record without its business row;
* the key usable afterwards: a retry with the same key runs once, or replays.

Connections are killed for real: ``pg_terminate_backend`` from a second connection,
or a port nobody listens on. Views are held mid-flight with the test app's
``HOOKS["during_view"]``. No fixed sleeps: where a test must see a database state (a
backend waiting for a lock), it polls for that state with a deadline (``faults.wait_for``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_idempotency import testing
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.faults import (
    RouteTo,
    admin_connection,
    extra_alias,
    terminate,
    unreachable,
    wait_for,
)
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

__all__ = ["extra_alias"]  # a fixture

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.support.robustness_app"),
]
postgres = pytest.mark.postgres


@pytest.fixture
def token() -> str:
    return TokenFactory(user__username="faulty").key


def post(token_key: str, key: str, name: str = "w") -> Any:
    return token_client(token_key).post(
        "/widgets", {"name": name}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def assert_503(response: Any) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "1"
    problem = json.loads(response.content)
    assert problem["type"].endswith("#store-unavailable") and problem["detail"]


def assert_consistent(key: str, name: str) -> int:
    """Business rows and completed records of ``key`` agree; returns how many (0 or 1)."""
    rows = Widget.objects.filter(name=name).count()
    completed = IdempotencyRecord.objects.filter(key=key, state=RecordState.COMPLETED).count()
    assert rows == completed <= 1, (rows, completed)
    return rows


def assert_retry_runs_once(token_key: str, key: str, name: str, *, ran_before: int) -> None:
    retry = post(token_key, key, name)
    assert retry.status_code == 201, retry.content
    assert ("Idempotent-Replayed" in retry) == bool(ran_before)
    assert assert_consistent(key, name) == 1
    assert post(token_key, key, name)["Idempotent-Replayed"] == "true"


# --- The store unreachable ----------------------------------------------------------


def test_store_unreachable_is_503_and_the_view_never_runs(token, extra_alias, on_postgres):
    down = extra_alias(**unreachable(on_postgres))
    ran: list[bool] = []
    HOOKS["during_view"] = lambda request: ran.append(True)
    key = str(uuid.uuid4())
    with override_settings(DATABASE_ROUTERS=[RouteTo(down)]):
        assert_503(post(token, key, "down"))
    assert ran == []
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert_retry_runs_once(token, key, "down", ran_before=0)  # the store is back


# --- The connection killed ----------------------------------------------------------


@postgres
def test_connection_killed_during_the_claim(token):
    """The claim waits on a table lock; its backend is terminated while it waits."""
    key = str(uuid.uuid4())
    ran: list[bool] = []
    HOOKS["during_view"] = lambda request: ran.append(True)
    with admin_connection() as blocker, admin_connection() as watcher:
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE django_idempotency_record IN ACCESS EXCLUSIVE MODE")
        runner = Runner()
        runner.start(lambda: post(token, key, "claim"))
        blocker_pid = blocker.info.backend_pid
        waiting = wait_for(
            lambda: watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> %s AND query LIKE %s",
                [blocker_pid, "%django_idempotency%"],
            ).fetchone()
        )
        terminate(waiting[0])
        blocker.execute("ROLLBACK")
        (response,) = runner.join()
    assert_503(response)
    assert ran == []
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0
    assert_retry_runs_once(token, key, "claim", ran_before=0)


@postgres
def test_connection_killed_before_the_completion(token):
    """The view wrote its row; the connection dies before the completing UPDATE."""
    key = str(uuid.uuid4())
    HOOKS["during_view"] = lambda request: terminate(connection.connection.info.backend_pid)
    response = post(token, key, "complete")
    del HOOKS["during_view"]
    assert_503(response)
    # The server rolled the transaction back; the claim was released on a new connection.
    assert assert_consistent(key, "complete") == 0
    assert IdempotencyRecord.objects.count() == 0
    assert_retry_runs_once(token, key, "complete", ran_before=0)


@pytest.fixture
def die_at_commit() -> Iterator[Callable[[str], None]]:
    """Arm a deferred trigger: the backend that commits the completion of ``key``
    terminates itself inside COMMIT."""
    with admin_connection() as admin:
        admin.execute(
            """
            CREATE TABLE IF NOT EXISTS hostile_die_at_commit (key text PRIMARY KEY);
            CREATE OR REPLACE FUNCTION hostile_die_at_commit() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.state = 'completed'
                   AND EXISTS (SELECT 1 FROM hostile_die_at_commit WHERE key = NEW.key) THEN
                    PERFORM pg_terminate_backend(pg_backend_pid());
                END IF;
                RETURN NULL;
            END $$;
            DROP TRIGGER IF EXISTS hostile_die_at_commit ON django_idempotency_record;
            CREATE CONSTRAINT TRIGGER hostile_die_at_commit
                AFTER UPDATE ON django_idempotency_record
                DEFERRABLE INITIALLY DEFERRED
                FOR EACH ROW EXECUTE FUNCTION hostile_die_at_commit();
            """
        )

        def arm(key: str) -> None:
            admin.execute("INSERT INTO hostile_die_at_commit VALUES (%s)", [key])

        try:
            yield arm
        finally:
            admin.execute(
                "DROP TRIGGER IF EXISTS hostile_die_at_commit ON django_idempotency_record;"
                "DROP FUNCTION IF EXISTS hostile_die_at_commit();"
                "DROP TABLE IF EXISTS hostile_die_at_commit;"
            )


@postgres
def test_connection_killed_at_commit(token, die_at_commit):
    """The connection dies inside COMMIT: the client cannot know whether it committed.

    Either way the record and the business row agree, and the retry converges: it
    runs once if nothing committed, or replays if everything did.
    """
    key = str(uuid.uuid4())
    die_at_commit(key)
    assert_503(post(token, key, "commit"))
    ran = assert_consistent(key, "commit")
    if not ran:
        assert IdempotencyRecord.objects.count() == 0  # released on a new connection
    with admin_connection() as admin:
        admin.execute("DELETE FROM hostile_die_at_commit")
    assert_retry_runs_once(token, key, "commit", ran_before=ran)


@postgres
def test_release_fails_too_then_the_lease_frees_the_key(token, extra_alias):
    """The connection dies mid-view and the database stays unreachable for the release.

    The claim stays (its lease is live). Without owner presence duplicates get 409 until
    the lease runs out, then a retry takes the claim over and runs once; with it (a
    direct connection) the retry takes over at once, the owner's session being gone.
    """
    alias = extra_alias()
    key = str(uuid.uuid4())

    def kill_and_cut_off(request: Any) -> None:
        pid = connections[alias].connection.info.backend_pid
        connections[alias].settings_dict.update(PORT="1", HOST="127.0.0.1")
        terminate(pid)

    router = RouteTo(alias, apps=("django_idempotency", "testapp"))
    with override_settings(DATABASE_ROUTERS=[router]):
        HOOKS["during_view"] = kill_and_cut_off
        response = post(token, key, "unreleased")
        del HOOKS["during_view"]
        assert_503(response)
        connections[alias].close()
        connections[alias].settings_dict.update(connections["default"].settings_dict)
        assert Widget.objects.filter(name="unreleased").count() == 0
        record = IdempotencyRecord.objects.get(key=key)
        assert record.state == RecordState.CLAIMED  # not released: nobody could
        if record.owner_pid is not None:
            # Owner presence: the owner's session was terminated, so its presence lock
            # went with it and the retry takes over at once (docs/robustness.md).
            retry = post(token, key, "unreleased")
        else:
            in_flight = post(token, key, "unreleased")
            assert in_flight.status_code == 409 and in_flight["Retry-After"]
            with testing.travel(61):  # past the 60 s lease
                retry = post(token, key, "unreleased")
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert assert_consistent(key, "unreleased") == 1


@postgres
def test_the_views_own_query_failing_is_its_500_and_releases(token):
    """Not our failure: the view's own query hits the dead connection. Django answers
    500 as it would without the app; the key is released, so the retry runs."""
    key = str(uuid.uuid4())

    def kill_then_query(request: Any) -> None:
        terminate(connection.connection.info.backend_pid)
        Widget.objects.count()

    HOOKS["during_view"] = kill_then_query
    response = post(token, key, "own")
    del HOOKS["during_view"]
    assert response.status_code == 500
    assert assert_consistent(key, "own") == 0
    assert IdempotencyRecord.objects.count() == 0
    assert_retry_runs_once(token, key, "own", ran_before=0)


@postgres
def test_phased_view_connection_killed_at_the_completion(token, die_at_commit):
    """Every phase committed, then the completion's COMMIT dies: 503, and the retry
    resumes after the last phase (nothing repeated) or replays."""
    from tests.support.testapp.views import HYPERVISOR

    HYPERVISOR.reset()
    key = str(uuid.uuid4())
    die_at_commit(key)
    client = token_client(token)
    first = client.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert_503(first)
    record = IdempotencyRecord.objects.get(key=key)
    assert record.recovery_point == "booted"  # the phases' effects are kept
    with admin_connection() as admin:
        admin.execute("DELETE FROM hostile_die_at_commit")
    retry = client.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retry.status_code == 201, retry.content
    assert json.loads(retry.content)["size"] == 2
    assert len(HYPERVISOR.boots) == 1  # booted once, whatever happened
    assert IdempotencyRecord.objects.get(key=key).state == RecordState.COMPLETED
    HYPERVISOR.reset()
