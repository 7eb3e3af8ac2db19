"""The view's savepoint statements are sent with its next statement, in order, or not
at all (``django_idempotency.savepoints``): what PostgreSQL receives, and that the
view's blocks behave exactly as without the app."""

from __future__ import annotations

import contextlib
import re
import uuid
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from django_idempotency import savepoints
from django_idempotency.models import IdempotencyRecord
from tests.concurrency import token_client
from tests.factories import TokenFactory
from tests.faults import admin_connection
from tests.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = ["between", "first", "last"]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement psycopg sends (Django's cursors are psycopg ClientCursors)."""
    seen: list[str] = []
    real = psycopg.ClientCursor.execute

    def spy(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        seen.append(str(query))
        return real(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", spy)
    return seen


def post(key: str | None, *spies: list[Any]) -> Any:
    """POST /tx/nested-blocks as a new user; ``spies`` are emptied just before."""
    token = TokenFactory(user__username=f"sp-{uuid.uuid4().hex[:8]}")
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    for spy in spies:
        spy.clear()
    return token_client(token.key).post("/tx/nested-blocks", {}, format="json", **headers)


def kinds(statements: list[str]) -> list[str]:
    """Each statement as SAVEPOINT / RELEASE / ROLLBACK TO / its first word."""
    out = []
    for sql in statements:
        for part in filter(None, (p.strip() for p in re.split(r";\s*", sql))):
            word = part.split()[0].upper()
            if part.startswith("ROLLBACK TO SAVEPOINT"):
                word = "ROLLBACK TO"
            elif part.startswith("RELEASE SAVEPOINT"):
                word = "RELEASE"
            out.append(word)
    return out


@pytest.mark.postgres
def test_releases_go_out_before_the_next_statement_and_the_last_ones_never(sent, commands):
    key = str(uuid.uuid4())
    response = post(key, sent, commands)
    assert response.status_code == 201, response.content
    assert set(response.json()) == {"last"}
    first = next(i for i, sql in enumerate(sent) if sql.startswith("SAVEPOINT"))
    order = kinds(sent[first:])
    assert commands == [b"BEGIN"]  # psycopg's; no COMMIT of its own: the completion's
    # first block: SAVEPOINT, INSERT, its release held until the next statement;
    # failing block: SAVEPOINT, INSERT, INSERT (refused), ROLLBACK TO and RELEASE at
    # once (Django's own handling); the write between; the last two blocks: their
    # releases are held and dropped, the COMMIT that follows releases them.
    assert order[:4] == ["SAVEPOINT", "INSERT", "RELEASE", "SAVEPOINT"]
    # the first block's SAVEPOINT went in one query with its INSERT, the first
    # release with the second block's SAVEPOINT
    assert [kinds([sql]) for sql in sent[first : first + 2]] == [
        ["SAVEPOINT", "INSERT"],
        ["RELEASE", "SAVEPOINT"],
    ]
    assert order[4:8] == ["INSERT", "INSERT", "ROLLBACK TO", "RELEASE"]
    assert order[8:11] == ["INSERT", "SAVEPOINT", "SAVEPOINT"]
    assert order[11:] == ["INSERT", "SELECT", "COMMIT"]  # the completion carries COMMIT
    assert sorted(Widget.objects.values_list("name", flat=True)) == NAMES  # and only
    assert IdempotencyRecord.objects.get().state == "completed"
    replay = post(key)  # another user's token: another principal, so it runs again
    assert replay.status_code == 201


@pytest.mark.postgres
def test_an_unkeyed_request_holds_nothing_back(sent):
    response = post(None, sent)
    order = kinds(sent)
    assert response.status_code == 201
    assert sorted(Widget.objects.values_list("name", flat=True)) == NAMES
    # Without the app's transaction the view's blocks are transactions of their own;
    # only the innermost block is a savepoint, and its release goes out at once.
    assert order.count("SAVEPOINT") == order.count("RELEASE") == 1
    assert order[-1] == "RELEASE"


@pytest.mark.postgres
def test_a_release_in_an_aborted_transaction_is_sent_at_once(sent):
    """Django's release fails in an aborted transaction and handles it there."""
    wrapper = savepoints.ViewSavepoints(connection)

    with transaction.atomic(), connection.execute_wrapper(wrapper):
        Widget.objects.create(name="placed")  # the savepoint below is not the first
        # The error is caught inside the block: the transaction is aborted.
        with (
            pytest.raises(DatabaseError),
            transaction.atomic(),
            connection.cursor() as cursor,
            contextlib.suppress(DatabaseError),
        ):
            cursor.execute("SELECT no_such_column FROM testapp_widget")
        # Django's release in the aborted transaction was sent (and failed), then Django
        # rolled back to the savepoint and released it: that release, in a healthy
        # transaction again, is held.
        order = kinds(sent)
        assert order[-3:] == ["SELECT", "RELEASE", "ROLLBACK TO"]
        assert len(wrapper.held) == 1 and wrapper.held[0].startswith("RELEASE SAVEPOINT")
        transaction.set_rollback(True)


@pytest.mark.postgres
def test_the_first_savepoint_goes_out_with_the_first_statement(sent, commands):
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        sent.clear()
        with transaction.atomic():
            assert sent == []  # nothing ran in the transaction: the savepoint waits
            assert len(wrapper.unsent) == 1
            Widget.objects.create(name="first")
        assert len(sent) == 1 and kinds(sent) == ["SAVEPOINT", "INSERT"]  # one query
        assert commands == [b"BEGIN"]  # psycopg's, before that query
        assert wrapper.unsent == [] and len(wrapper.held) == 1
        with transaction.atomic():  # the transaction has begun: sent as it comes
            Widget.objects.create(name="second")
        assert kinds(sent[1:]) == ["RELEASE", "SAVEPOINT", "INSERT"]
        assert len(sent) == 3  # the release went with the second SAVEPOINT
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["first", "second"]


@pytest.mark.postgres
def test_the_view_reads_its_own_statements_result(sent):
    """Sent after the held statements in one query, the view's statement still gives
    the view its rows, row count and description."""
    Widget.objects.bulk_create([Widget(name="a"), Widget(name="b"), Widget(name="c")])
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with transaction.atomic():
            assert Widget.objects.filter(name__in=["a", "b"]).update(size=7) == 2
        assert kinds(sent[-1:]) == ["SAVEPOINT", "UPDATE"]
        with transaction.atomic(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT name, size FROM testapp_widget ORDER BY name")
            assert [column.name for column in cursor.description] == ["name", "size"]
            assert cursor.fetchall() == [("a", 7), ("b", 7), ("c", 0)]
        # The first block's release went with the next savepoint; the transaction had
        # begun, so these two went as they came.
        assert [kinds([sql]) for sql in sent[-3:]] == [
            ["RELEASE", "SAVEPOINT"],
            ["SAVEPOINT"],
            ["SELECT"],
        ]
        assert list(
            Widget.objects.filter(size=7).values_list("name", flat=True).order_by("name")
        ) == [
            "a",
            "b",
        ]
        transaction.set_rollback(True)


@pytest.mark.postgres
def test_a_block_that_runs_nothing_costs_nothing(sent, commands):
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        sent.clear()
        with transaction.atomic():
            pass
        with contextlib.suppress(ValueError), transaction.atomic():
            raise ValueError
        sid = transaction.savepoint()
        transaction.savepoint_rollback(sid)
        transaction.savepoint_commit(sid)
        assert sent == [] and commands == []  # no transaction was even begun
        assert wrapper.unsent == [] and wrapper.held == []


@pytest.mark.postgres
def test_a_syntax_error_in_the_first_statement_is_the_views_as_without_the_app(sent):
    """PostgreSQL rejects the whole query on a syntax error, the held savepoint with it:
    the block's rollback still recovers the transaction and the next write commits."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with (
            pytest.raises(DatabaseError) as caught,
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELEC 1")
        assert caught.value.__cause__.sqlstate == "42601"
        Widget.objects.create(name="after")
    assert list(Widget.objects.values_list("name", flat=True)) == ["after"]


@pytest.mark.postgres
def test_a_refused_first_statement_caught_inside_its_block_fails_the_block():
    """Without the app the block's release fails in the aborted transaction, and
    Django raises it at the block's exit; so it does here, and the next write commits."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with (
            pytest.raises(DatabaseError),
            transaction.atomic(),
            connection.cursor() as cursor,
            contextlib.suppress(DatabaseError),
        ):
            cursor.execute("SELECT no_such_column FROM testapp_widget")
        Widget.objects.create(name="after")
    assert list(Widget.objects.values_list("name", flat=True)) == ["after"]


def copy_widgets(*names: str, table: str = "testapp_widget") -> None:
    """Write rows with psycopg's COPY: past Django's execute wrappers."""
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} (name, size) FROM STDIN") as copy,
    ):
        for name in names:
            copy.write_row([name, 0])


@pytest.mark.postgres
def test_a_block_rolled_back_after_a_copy_undoes_the_copy():
    """The held savepoint is not sent after the COPY (it would not cover it): it stands
    for the transaction's start, and the rollback to it is the transaction's."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with contextlib.suppress(ValueError), transaction.atomic():
            copy_widgets("copied")
            Widget.objects.create(name="written")  # does not place the savepoint late
            assert Widget.objects.count() == 2
            raise ValueError
        assert Widget.objects.count() == 0
        with transaction.atomic():
            Widget.objects.create(name="kept")
    assert list(Widget.objects.values_list("name", flat=True)) == ["kept"]


@pytest.mark.postgres
def test_releases_sent_after_a_copy_leave_the_first_savepoint_standing(sent):
    """After the COPY, an inner block's release goes out with the next statement; the
    first block's savepoint, never placed, still stands for the transaction's start."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with contextlib.suppress(ValueError), transaction.atomic():
            copy_widgets("copied")
            with transaction.atomic():
                Widget.objects.create(name="inner")
            assert len(wrapper.held) == 1 and len(wrapper.unsent) == 1
            Widget.objects.create(name="written")
            assert kinds(sent[-1:]) == ["RELEASE", "INSERT"]
            assert wrapper.held == [] and len(wrapper.unsent) == 1
            raise ValueError
        assert Widget.objects.count() == 0
        Widget.objects.create(name="kept")
    assert list(Widget.objects.values_list("name", flat=True)) == ["kept"]


@pytest.mark.postgres
def test_a_failing_copy_in_the_first_block_is_recovered_as_without_the_app():
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with pytest.raises(psycopg.Error), transaction.atomic():
            copy_widgets("lost", table="no_such_table")
        Widget.objects.create(name="after")
        with transaction.atomic():
            copy_widgets("copied")
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after", "copied"]


@pytest.mark.postgres
def test_a_manual_savepoint_rolled_back_and_released(sent):
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        sid = transaction.savepoint()
        Widget.objects.create(name="undone")
        transaction.savepoint_rollback(sid)
        Widget.objects.create(name="kept")
        transaction.savepoint_commit(sid)
        second = transaction.savepoint()
        transaction.savepoint_rollback(second)
        Widget.objects.create(name="also kept")
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["also kept", "kept"]


@pytest.mark.postgres
def test_statements_that_cannot_carry_it_get_the_savepoint_first(sent):
    """``executemany`` and named cursors (``.iterator()``) take one statement per query:
    the held savepoint goes in its own just before, and still covers them."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with contextlib.suppress(ValueError), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO testapp_widget (name, size) VALUES (%s, 0)", [["x"], ["y"]]
                )
            assert kinds(sent[-1:]) == ["SAVEPOINT"]  # alone, before the INSERTs
            raise ValueError
        assert Widget.objects.count() == 0
        Widget.objects.create(name="locked")
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with transaction.atomic():
            locked = list(Widget.objects.select_for_update().iterator(chunk_size=10))
        assert [w.name for w in locked] == ["locked"]


@pytest.mark.postgres
def test_held_releases_go_out_in_order_before_the_next_statement():
    wrapper = savepoints.ViewSavepoints(connection)

    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with transaction.atomic(), transaction.atomic():
            Widget.objects.create(name="inner")
        assert len(wrapper.held) == 2
        assert wrapper.held[0] > wrapper.held[1]  # the inner block's first
        assert Widget.objects.count() == 1  # flushed first, then counted
        assert wrapper.held == []
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_catalog.pg_stat_activity")
        transaction.set_rollback(True)


def test_other_databases_hold_nothing(settings):
    if connection.vendor == "postgresql":
        pytest.skip("SQLite: nothing is held")
    with savepoints.view_savepoints("default") as wrapper:
        assert wrapper is None


@pytest.mark.postgres
def test_the_connection_is_left_as_django_expects(sent):
    """After the request no transaction is open and both Django and psycopg are in
    autocommit, so a write outside any block commits at once, as Django promises."""
    assert post(str(uuid.uuid4())).status_code == 201
    raw = connection.connection
    assert raw.autocommit is True and connection.get_autocommit()
    assert int(raw.info.transaction_status) == 0  # idle: nothing left open
    Widget.objects.create(name="autocommitted")
    with admin_connection() as other:
        seen = other.execute("SELECT count(*) FROM testapp_widget WHERE name = 'autocommitted'")
        assert seen.fetchone() == (1,)
