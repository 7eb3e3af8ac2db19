"""The view's savepoint wrapper (``django_idempotency.transactions.savepoints``) changes
nothing a view sees, on real PostgreSQL. Each scenario runs twice: as the same code inside
one ``transaction.atomic()`` (what the view does without the app), and inside it with the
app's wrapper installed as ``execution._execute_atomic`` installs it
(``savepoints.view_savepoints`` and ``drop()`` before the end); some also end to end,
keyed, through ``/savepoints/scenario`` (tests/support/testapp/views.py::savepoint_scenario).
What the view sees, what commits and what is raised are the same.

The scenarios: the view's own SQL that starts like the wrapper's (SAVEPOINT, RELEASE),
psycopg's pipeline mode, COPY, the view's own execute wrappers and captured queries,
cursor results, callproc, streams, NOWAIT, statement timeouts, manual savepoints,
durable blocks, ``on_commit``, ``set_rollback`` and connections closed in a block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency.models import IdempotencyRecord
from tests.support.faults import admin_connection
from tests.support.savepoint_scenarios import (  # noqa: F401  (the autouse fixtures)
    INSERT,
    _no_hooks,
    _wrapper_under_test,
    committed,
    new_savepoint,
    post_keyed,
    post_unkeyed_in_atomic,
    recording,
    run,
    same,
)
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.pooled]


def raw_savepoint_then_insert() -> Any:
    """The view's first statement is its own multi-statement SQL, starting with a
    SAVEPOINT of its own (e.g. a hand-written migration-like batch)."""
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT mine; " + INSERT.format("raw"))
    return "done"


def test_a_multi_statement_sql_starting_with_savepoint_is_run():
    """The view's own SQL that starts like Django's SAVEPOINT statement is the view's:
    it runs, and the INSERT commits."""
    assert same(raw_savepoint_then_insert) == ("ok", "done", ["raw"])


def test_a_multi_statement_sql_starting_with_savepoint_end_to_end():
    response = post_keyed(raw_savepoint_then_insert)
    assert response.status_code == 201, response.content[:300]
    assert committed() == ["raw"]
    assert IdempotencyRecord.objects.get().state == "completed"


def raw_savepoint_then_select() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT mine; SELECT 42")
        cursor.nextset()
        return cursor.fetchone()[0]


def test_a_multi_statement_sql_starting_with_savepoint_gives_its_result():
    """The view reads its own result, 42."""
    assert same(raw_savepoint_then_select) == ("ok", 42, [])


def raw_release_then_insert() -> Any:
    Widget.objects.create(name="first")  # the transaction has begun
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT mine")
        cursor.execute("RELEASE SAVEPOINT mine; " + INSERT.format("raw"))
    return "done"


def test_a_multi_statement_sql_starting_with_release_is_run():
    """SQL of the view's own that starts like Django's release is not held: a
    prefix match would hold it and drop it before the completion, and the INSERT would
    never run."""
    assert same(raw_release_then_insert) == ("ok", "done", ["first", "raw"])


def copy_widgets(*names: str) -> None:
    """Rows written with psycopg's COPY: past Django's execute wrappers."""
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy("COPY testapp_widget (name, size) FROM STDIN") as copy,
    ):
        for name in names:
            copy.write_row([name, 0])


def pipelined_first_write() -> Any:
    """psycopg's pipeline mode around a block's first write."""
    with transaction.atomic(), connection.connection.pipeline():
        Widget.objects.create(name="piped")
    return "done"


def test_a_first_write_in_psycopg_pipeline_mode():
    """In pipeline mode psycopg sends every query with the extended protocol, which
    takes one statement per query: the write commits as without the app."""
    assert same(pipelined_first_write) == ("ok", "done", ["piped"])


def pipelined_after_a_block() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="first")
    with connection.connection.pipeline():
        Widget.objects.create(name="piped")
    return "done"


def test_a_write_in_pipeline_mode_after_a_block():
    """The held release goes out on its own before the pipelined INSERT."""
    assert same(pipelined_after_a_block) == ("ok", "done", ["first", "piped"])


def txid_around_a_rolled_back_copy() -> Any:
    """The block's first statement is a COPY; the block fails and is rolled back."""
    with contextlib.suppress(ValueError), transaction.atomic():
        copy_widgets("copied")
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current(), transaction_timestamp()")
            before = cursor.fetchone()
        raise ValueError
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current(), transaction_timestamp()")
        after = cursor.fetchone()
    return after == before


def test_a_block_rolled_back_after_a_copy_stays_in_the_same_transaction():
    """Without the app the block's ROLLBACK TO SAVEPOINT keeps the transaction (its id,
    its start time, its snapshot); so it does with the wrapper."""
    assert same(txid_around_a_rolled_back_copy) == ("ok", True, [])


def repeatable_read_after_a_rolled_back_copy() -> Any:
    with contextlib.suppress(ValueError), transaction.atomic():
        copy_widgets("copied")  # the transaction's snapshot is taken here
        raise ValueError
    with admin_connection() as admin:  # another request commits meanwhile
        admin.execute(INSERT.format("concurrent"))
    return Widget.objects.filter(name="concurrent").exists()


def test_a_block_rolled_back_after_a_copy_keeps_the_snapshot_under_repeatable_read():
    """Under REPEATABLE READ the view must not see what committed after its
    transaction's first statement, with the wrapper or not."""
    connection.ensure_connection()
    raw = connection.connection
    previous = raw.isolation_level
    raw.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        without = run(repeatable_read_after_a_rolled_back_copy, app=False)
        with_app = run(repeatable_read_after_a_rolled_back_copy, app=True)
    finally:
        raw.isolation_level = previous
    assert without == ("ok", False, ["concurrent"])
    assert with_app == without


def manual_savepoint_copy_then_logged_rollback() -> Any:
    sid = new_savepoint()
    copy_widgets("copied")
    with CaptureQueriesContext(connection):
        transaction.savepoint_rollback(sid)
    Widget.objects.create(name="after")
    return "done"


def test_a_savepoint_held_before_a_copy_and_rolled_back_while_queries_are_logged():
    """A COPY after a manual savepoint, then its rollback while Django logs queries."""
    assert same(manual_savepoint_copy_then_logged_rollback) == ("ok", "done", ["after"])


def block_copy_then_logged_release() -> Any:
    ctx = CaptureQueriesContext(connection)
    try:
        with transaction.atomic():
            copy_widgets("copied")
            ctx.__enter__()  # e.g. a profiler turned on in the middle of the block
    finally:
        ctx.__exit__(None, None, None)
    return "done"


def test_a_block_held_before_a_copy_and_released_while_queries_are_logged():
    assert same(block_copy_then_logged_release) == ("ok", "done", ["copied"])


def user_wrapper_in_the_first_block() -> Any:
    """A wrapper of the view's own (sqlcommenter, a query auditor, a read-only guard)
    installed inside the view's first block."""
    seen, record = recording()
    with transaction.atomic(), connection.execute_wrapper(record):
        Widget.objects.create(name="w")
    return seen


def test_a_wrapper_of_the_views_own_sees_its_first_statement():
    """The view's own wrapper sees the INSERT as it was made."""
    assert same(user_wrapper_in_the_first_block) == ("ok", ["INSERT"], ["w"])


def user_wrapper_after_a_block() -> Any:
    seen, record = recording()
    with transaction.atomic():
        Widget.objects.create(name="w")
    with connection.execute_wrapper(record):
        Widget.objects.count()
    return seen


def test_a_wrapper_of_the_views_own_sees_its_statement_after_a_block():
    """A wrapper the view installs after a block sees its SELECT only: the block's held
    release goes out past the wrappers (it once went through them, late)."""
    assert same(user_wrapper_after_a_block) == ("ok", ["SELECT"], ["w"])


def captured_in_the_first_block() -> Any:
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        Widget.objects.create(name="a")
    return [q["sql"].split()[0] for q in captured.captured_queries]


def test_queries_captured_in_the_first_block_are_the_views():
    """CaptureQueriesContext opened inside a block logs the view's INSERT as made."""
    assert same(captured_in_the_first_block) == ("ok", ["INSERT"], ["a"])


def captured_after_a_block() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    with CaptureQueriesContext(connection) as captured:
        Widget.objects.count()
    return [q["sql"].split()[0] for q in captured.captured_queries]


def test_queries_captured_after_a_block_are_the_views():
    """One query, the view's SELECT: the block's held release is not logged there (it
    once was, so ``assertNumQueries(1)`` failed)."""
    assert same(captured_after_a_block) == ("ok", ["SELECT"], ["a"])


def cursor_result(sql: str, params: Any = None, sets: int = 0) -> Callable[[], Any]:
    """A first block whose first statement is ``sql``; what the view reads of it."""

    def scenario() -> Any:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            for _ in range(sets):
                cursor.nextset()
            rows = cursor.fetchall() if cursor.description else None
            return [cursor.rowcount, cursor.statusmessage, rows]

    return scenario


@pytest.mark.parametrize(
    ("sql", "params", "sets"),
    [
        (INSERT.format("m") + "; SELECT 7", None, 0),  # the view's own several statements
        (INSERT.format("m") + "; SELECT 7", None, 1),
        ("SELECT 1; SELECT 2; SELECT 3", None, 2),
        ("SELECT '100%%'", None, 0),
        ("SELECT '100%%', %s", [1], 0),
        ("SELECT %s::text", ["a; RELEASE SAVEPOINT x"], 0),
        ("SELECT 1;", None, 0),
        ("SELECT 1 -- a comment at the end", None, 0),
        ("/* a comment first */ SELECT 1", None, 0),
        ("SET LOCAL statement_timeout = '5s'", None, 0),
        ("LOCK TABLE testapp_widget IN SHARE MODE", None, 0),
        ("DO $$ BEGIN INSERT INTO testapp_widget (name, size) VALUES ('do', 0); END $$", None, 0),
        ("UPDATE testapp_widget SET size = 1 WHERE false", None, 0),
        (INSERT.format("r") + " RETURNING name", None, 0),
        ("SAVEPOINT mine", None, 0),  # the view's own savepoint, alone
    ],
)
def test_the_first_statement_reads_as_without_the_app(sql, params, sets):
    """The last case fails: the view's own ``SAVEPOINT mine`` is held as Django's, so
    the cursor has no result (``statusmessage`` None instead of "SAVEPOINT")."""
    same(cursor_result(sql, params, sets))


def orm_results() -> Any:
    Widget.objects.bulk_create([Widget(name="a"), Widget(name="b"), Widget(name="c")])
    with transaction.atomic():
        ids = [w.pk is not None for w in Widget.objects.bulk_create([Widget(name="d")])]
    with transaction.atomic():
        updated = Widget.objects.filter(name__in=["a", "b"]).update(size=3)
    with transaction.atomic(), transaction.atomic():
        deleted = Widget.objects.filter(name="c").delete()
    with transaction.atomic():
        got = Widget.objects.get_or_create(name="e")[1]
    return [ids, updated, deleted, got, Widget.objects.count()]


def test_orm_row_counts_and_returned_ids():
    assert same(orm_results)[1] == [[True], 2, (1, {"testapp.Widget": 1}), True, 4]


def callproc_then_raise() -> Any:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION r3_add(n text) RETURNS int AS $$ "
            "INSERT INTO testapp_widget (name, size) VALUES (n, 0) RETURNING 1 $$ "
            "LANGUAGE sql"
        )
    with contextlib.suppress(ValueError), transaction.atomic():
        with connection.cursor() as cursor:  # callproc: past the wrappers
            cursor.callproc("r3_add", ["lost"])
        raise ValueError
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.callproc("r3_add", ["kept"])
    return "done"


def test_callproc_in_blocks():
    assert same(callproc_then_raise) == ("ok", "done", ["kept"])


def callproc_first_block() -> Any:
    with contextlib.suppress(ValueError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.callproc("pg_sleep", [0])
        Widget.objects.create(name="lost")
        raise ValueError
    Widget.objects.create(name="kept")
    return "done"


def test_callproc_first_in_a_block_rolled_back():
    assert same(callproc_first_block) == ("ok", "done", ["kept"])


def stream_then_raise() -> Any:
    with contextlib.suppress(ValueError), transaction.atomic():
        with connection.cursor() as cursor:
            list(cursor.stream(INSERT.format("lost") + " RETURNING id"))
        raise ValueError
    with transaction.atomic(), connection.cursor() as cursor:
        names = [r[0] for r in cursor.stream(INSERT.format("kept") + " RETURNING name")]
    return names


def test_cursor_stream_in_blocks():
    assert same(stream_then_raise) == ("ok", ["kept"], ["kept"])


def nowait_refused() -> Any:
    admin = admin_connection()
    admin.execute(INSERT.format("locked"))
    admin.autocommit = False
    admin.execute("SELECT * FROM testapp_widget FOR UPDATE")
    try:
        try:
            with transaction.atomic():
                list(Widget.objects.select_for_update(nowait=True))
        except DatabaseError as exc:
            refused = type(exc).__name__
        Widget.objects.create(name="after")
        return refused
    finally:
        admin.rollback()
        admin.close()


def test_select_for_update_nowait_refused_first():
    assert same(nowait_refused) == ("ok", "OperationalError", ["after", "locked"])


def cancelled_first_statement() -> Any:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
    except DatabaseError as exc:
        cancelled = type(exc.__cause__).__name__
    Widget.objects.create(name="after")
    return cancelled


def test_a_first_statement_cancelled_by_statement_timeout():
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '100ms'")
    try:
        assert same(cancelled_first_statement) == ("ok", "QueryCanceled", ["after"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")


def timeout_set_locally() -> Any:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '100ms'")
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(2)")
        except DatabaseError as exc:
            cancelled = type(exc.__cause__).__name__
        Widget.objects.create(name="after")
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        timeout = cursor.fetchone()[0]
    return [cancelled, timeout]


def test_set_local_statement_timeout_in_the_first_block():
    assert same(timeout_set_locally) == ("ok", ["QueryCanceled", "100ms"], ["after"])


def manual_savepoints() -> Any:
    outer = new_savepoint()
    inner = new_savepoint()
    Widget.objects.create(name="undone")
    transaction.savepoint_rollback(outer)
    try:
        transaction.savepoint_commit(inner)  # rolled back with outer: no such savepoint
    except DatabaseError as exc:
        refused = type(exc.__cause__).__name__
    transaction.savepoint_rollback(outer)
    Widget.objects.create(name="kept")
    transaction.savepoint_commit(outer)
    return refused


def test_manual_savepoints_out_of_order():
    """Releasing a savepoint that a rollback to an outer one destroyed: without the app
    the release fails where it is made (caught by the view), and so it does here: only
    the release of a savepoint still standing is held (held, the destroyed one's would
    fail with the next statement, uncaught)."""
    assert same(manual_savepoints) == ("ok", "InvalidSavepointSpecification", ["kept"])


def savepoint_false_raises() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="first")
    with contextlib.suppress(ValueError), transaction.atomic(savepoint=False):
        raise ValueError
    return transaction.get_rollback()


def test_atomic_savepoint_false_that_raises_dooms():
    assert same(savepoint_false_raises) == ("ok", True, [])


def durable_inside() -> Any:
    with transaction.atomic(durable=True):
        Widget.objects.create(name="never")


def test_a_durable_block_is_refused_as_without_the_app():
    assert same(durable_inside) == ("raised", "RuntimeError", [])


def on_commit_hooks() -> Any:
    ran: list[str] = []
    transaction.on_commit(lambda: ran.append("before"))
    with contextlib.suppress(ValueError), transaction.atomic():
        transaction.on_commit(lambda: ran.append("dropped"))
        copy_widgets("copied")
        raise ValueError
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append("kept"))
        Widget.objects.create(name="w")
    return ran


def test_on_commit_callbacks_around_a_copy_rolled_back():
    assert same(on_commit_hooks) == ("ok", ["before", "kept"], ["w"])


def failing_then_caught_in_nested_blocks() -> Any:
    with transaction.atomic():
        try:
            with transaction.atomic(), transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
        except DatabaseError as exc:
            caught = type(exc.__cause__).__name__
        Widget.objects.create(name="kept")
    return caught


def test_a_refused_first_statement_two_blocks_deep():
    assert same(failing_then_caught_in_nested_blocks) == ("ok", "DivisionByZero", ["kept"])


def raw_copy_then_release_in_aborted() -> Any:
    """A block whose COPY fails and is caught inside it: without the app Django's
    release fails at the block's exit and the block raises."""
    with (
        transaction.atomic(),
        contextlib.suppress(psycopg.Error),
        connection.cursor() as cursor,
        cursor.cursor.copy("COPY testapp_widget (name, size) FROM STDIN") as copy,
    ):
        copy.write_row(["bad", "x"])
    return "done"


def test_a_failing_copy_caught_in_the_first_block():
    assert same(raw_copy_then_release_in_aborted)[0] == "raised"


def set_rollback_after_blocks() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    transaction.set_rollback(True)
    return "done"


def test_set_rollback_after_a_block():
    assert same(set_rollback_after_blocks) == ("ok", "done", [])


def executemany_then_iterator() -> Any:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany("INSERT INTO testapp_widget (name, size) VALUES (%s, 0)", [["x"], ["y"]])
        many = cursor.rowcount
    with transaction.atomic():
        names = [w.name for w in Widget.objects.order_by("name").iterator(chunk_size=1)]
    return [many, names]


def test_executemany_and_iterator_after_a_block():
    assert same(executemany_then_iterator) == ("ok", [2, ["x", "y"]], ["x", "y"])


def test_the_e2e_view_writes_commit_as_unkeyed_in_atomic():
    """A keyed request through the app for a view with blocks, copy and callproc."""

    def scenario() -> Any:
        with transaction.atomic():
            copy_widgets("copied")
        with contextlib.suppress(ValueError), transaction.atomic():
            Widget.objects.create(name="lost")
            raise ValueError
        with transaction.atomic(), transaction.atomic():
            Widget.objects.create(name="last")
        return Widget.objects.count()

    baseline = post_unkeyed_in_atomic(scenario)
    assert baseline.status_code == 201
    expected = committed()
    Widget.objects.all().delete()
    keyed = post_keyed(scenario)
    assert keyed.status_code == 201, keyed.content[:300]
    assert keyed.json() == baseline.json()
    assert committed() == expected == ["copied", "last"]
    assert IdempotencyRecord.objects.get().state == "completed"


def close_in_a_block() -> Any:
    try:
        with transaction.atomic():
            Widget.objects.create(name="a")
            connection.close()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


def test_connection_closed_inside_a_block():
    same(close_in_a_block)


def close_in_a_first_empty_block() -> Any:
    try:
        with transaction.atomic():
            connection.close()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


def test_connection_closed_inside_an_empty_first_block():
    same(close_in_a_first_empty_block)


def test_a_pipelined_first_write_end_to_end():
    def scenario() -> Any:
        return pipelined_first_write()

    baseline = post_unkeyed_in_atomic(scenario)
    assert baseline.status_code == 201
    Widget.objects.all().delete()
    keyed = post_keyed(scenario)
    assert keyed.status_code == 201, keyed.content[:200]
    assert committed() == ["piped"]
