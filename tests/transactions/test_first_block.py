"""Views whose first statement opens a block (a savepoint first) on real PostgreSQL:
the view works as it does without the app (a locking iterator, a caught failing COPY),
its writes commit with the completion, and every failure (an error, a 503, a takeover,
a killed connection) commits nothing and leaves a fresh connection for the next
request."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection

from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.faults import admin_connection, terminate
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def post(path: str, key: str | None, data: dict[str, Any] | None = None) -> Any:
    token = TokenFactory(user__username=f"first-block-{uuid.uuid4().hex[:8]}")
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return token_client(token.key).post(path, data or {}, format="json", **headers)


def test_a_locking_iterator_works_in_a_view_whose_first_statement_is_a_savepoint():
    """Django declares ``.iterator()``'s server-side cursor ``WITH HOLD`` when the
    driver's connection is in autocommit, and PostgreSQL refuses ``WITH HOLD`` with
    ``FOR UPDATE``: inside the app's transaction the view's locking iterator, after a
    first block, works (201), as it does inside ``transaction.atomic()`` without the
    app."""
    keyed = post("/first-block/lock-iterate", str(uuid.uuid4()))
    assert keyed.status_code == 201, keyed.content[:300]
    assert keyed.json() == {"names": ["first"]}
    assert IdempotencyRecord.objects.get().state == "completed"


def test_a_caught_failing_copy_after_a_closed_block_keeps_the_views_writes():
    """A failing ``cursor.copy()`` caught outside its block rolls that block back to its
    savepoint: the view's writes before and after it commit with the completion, as
    without a key."""
    unkeyed = post("/first-block/copy-caught", None)
    assert unkeyed.status_code == 201, unkeyed.content
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after", "kept"]
    Widget.objects.all().delete()
    keyed = post("/first-block/copy-caught", str(uuid.uuid4()))
    assert keyed.status_code == 201, keyed.content[:300]
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after", "kept"]
    assert IdempotencyRecord.objects.get().state == "completed"
    assert connection.get_autocommit() and connection.connection.autocommit is True


@pytest.fixture(autouse=True)
def _no_hooks() -> Any:
    yield
    HOOKS.clear()


def committed() -> list[str]:
    """The view's rows another session sees (committed)."""
    with admin_connection() as admin:
        rows = admin.execute(
            "SELECT name FROM testapp_widget WHERE name IN ('first', 'last')"
        ).fetchall()
    return sorted(name for (name,) in rows)


def assert_fresh() -> None:
    """Django and psycopg agree on autocommit, no transaction is left open, an unkeyed
    write commits at once and a keyed request works."""
    raw = connection.connection
    if raw is not None and not raw.closed:
        assert connection.get_autocommit() and raw.autocommit is True
        assert int(raw.info.transaction_status) == 0
    name = f"auto-{uuid.uuid4().hex[:6]}"
    Widget.objects.create(name=name)
    with admin_connection() as admin:
        seen = admin.execute("SELECT count(*) FROM testapp_widget WHERE name = %s", [name])
        assert seen.fetchone() == (1,)
    again = post("/first-block/block-then", str(uuid.uuid4()))
    assert again.status_code == 201, again.content[:300]


def test_a_view_that_opens_a_block_first_commits_its_writes_with_the_completion():
    """Both blocks' writes and the completed record commit together; after it, and
    after a view that raised, the connection is fresh."""
    assert post("/first-block/block-then", str(uuid.uuid4())).status_code == 201
    assert committed() == ["first", "last"]
    assert IdempotencyRecord.objects.get().state == "completed"
    assert_fresh()
    assert post("/first-block/block-then", str(uuid.uuid4()), {"mode": "raise"}).status_code == 500
    assert_fresh()


@pytest.mark.parametrize(("data", "status"), [({"mode": "raise"}, 500), ({"status": 503}, 503)])
def test_a_failure_after_a_view_that_opens_a_block_first_leaves_a_fresh_connection(data, status):
    assert post("/first-block/block-then", str(uuid.uuid4()), data).status_code == status
    assert committed() == [] and not IdempotencyRecord.objects.exists()
    assert_fresh()


def test_a_takeover_after_a_view_that_opens_a_block_first_commits_nothing():
    def fence(request: object) -> None:
        with admin_connection() as admin:
            admin.execute(
                "UPDATE django_idempotency_record SET owner_token = gen_random_uuid() "
                "WHERE state = 'claimed'"
            )

    HOOKS["during_view"] = fence
    assert post("/first-block/block-then", str(uuid.uuid4())).status_code == 409
    HOOKS.clear()
    assert committed() == []
    assert_fresh()


def test_a_connection_killed_after_a_view_that_opens_a_block_first():
    HOOKS["during_view"] = lambda request: terminate(connection.connection.info.backend_pid)
    assert post("/first-block/block-then", str(uuid.uuid4())).status_code in (500, 503)
    HOOKS.clear()
    assert committed() == []
    assert_fresh()


def test_a_connection_killed_before_the_first_block_of_a_view():
    """The first block's statement meets a dead connection: the request fails with
    nothing committed, and the next request gets a fresh connection."""
    HOOKS["before_block"] = lambda request: terminate(connection.connection.info.backend_pid)
    assert post("/first-block/block-then", str(uuid.uuid4())).status_code in (500, 503)
    HOOKS.clear()
    assert committed() == []
    assert_fresh()


def test_a_view_that_opens_a_block_first_on_a_server_defaulting_to_repeatable_read(
    server_repeatable_read: Any,
):
    """The view's transaction takes the server's default isolation, as without the app,
    and the view's writes commit once with its completion."""
    levels: list[str] = []

    def look(request: object) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            levels.append(cursor.fetchone()[0])

    HOOKS["during_view"] = look
    assert post("/first-block/block-then", str(uuid.uuid4())).status_code == 201
    HOOKS.clear()
    assert levels == ["repeatable read"]
    assert committed() == ["first", "last"]
    assert IdempotencyRecord.objects.get().state == "completed"
    assert_fresh()
