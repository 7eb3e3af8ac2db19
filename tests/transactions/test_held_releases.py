"""The view's held ``RELEASE SAVEPOINT`` statements (``django_idempotency.transactions.savepoints``)
on real PostgreSQL: wrappers of the view's own, savepoints destroyed by the view's own
SQL, connections closed or killed while a release is held, query logging switched on or
off, savepoint ids reused, other aliases, ``set_autocommit``, async views, COPY and
pipelines after a held release. Each scenario runs twice through
tests/support/savepoint_scenarios.py's ``same()``: as plain code inside one
``transaction.atomic()``, and inside it with the app's wrapper installed as
``execution._execute_atomic`` installs it; some also end to end, keyed, through
``/savepoints/scenario``. What the view sees, what commits and what is raised are the
same."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from psycopg import sql as pgsql

from django_idempotency.models import IdempotencyRecord
from django_idempotency.transactions import savepoints
from tests.support.faults import admin_connection, terminate
from tests.support.pgbouncer import NOT_POOLED
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


@pytest.fixture(autouse=True)
def _clean_wrappers() -> Any:
    """Every test starts and ends with no execute wrapper on the connection."""
    connection.execute_wrappers.clear()
    yield
    leftover = list(connection.execute_wrappers)
    connection.execute_wrappers.clear()
    assert not any(isinstance(w, savepoints.ViewSavepoints) for w in leftover), leftover


def passthrough(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
    return execute(sql, params, many, context)


def nested_blocks_then_count() -> int:
    """Ordinary code after the request: two blocks, then a read (autocommit)."""
    with transaction.atomic(), transaction.atomic():
        Widget.objects.create(name="later")
    return Widget.objects.count()


def test_a_wrapper_the_view_leaves_installed_does_not_leave_the_apps_behind():
    """A view enters an execute wrapper's context and never leaves it (a profiler
    started in the view and stopped by a signal that never fired, an ExitStack kept on
    the request). Without the app, that pass-through wrapper stays on the connection,
    harmless; so it must with the app, and the app's wrapper must go. (What this rules out:
    the app's exit, through ``execute_wrapper``, popping the *last* wrapper: the view's
    went and ``ViewSavepoints`` stayed for good, holding releases in later transactions
    that nobody dropped, sent outside any transaction before a later statement, which
    failed.)"""
    leaked: list[Any] = []

    def scenario() -> Any:
        cm = connection.execute_wrapper(passthrough)
        cm.__enter__()  # never left
        leaked.append(cm)
        with transaction.atomic():
            Widget.objects.create(name="in-view")
        return "done"

    keyed = post_keyed(scenario)
    assert keyed.status_code == 201, keyed.content[:300]
    try:
        # Ordinary code after the request, on the same connection (it failed with a
        # stale wrapper: the inner block's release held past COMMIT, which does not go
        # through the wrappers, then sent in autocommit before the count).
        assert nested_blocks_then_count() == 2
        assert connection.execute_wrappers == [passthrough]  # as without the app
    finally:
        connection.execute_wrappers.clear()
        connection.execute_wrappers.append(passthrough)
        leaked[0].__exit__(None, None, None)  # pops that one: nothing left


def test_a_wrapper_entered_in_the_view_and_left_after_it_sees_the_on_commit_statements():
    """A wrapper the view enters and code after the view leaves (middleware's
    process_response, request_finished) sees every statement until then, the
    ``on_commit`` callbacks' too, without the app, and so with it. (What this rules out: the
    app's exit popping the view's wrapper in place of its own: the on_commit INSERT was
    not seen.)"""
    seen, record = recording()
    contexts: list[Any] = []

    def scenario() -> Any:
        cm = connection.execute_wrapper(record)
        cm.__enter__()
        contexts.append(cm)
        with transaction.atomic():
            Widget.objects.create(name="in-view")
        transaction.on_commit(lambda: Widget.objects.create(name="on-commit"))
        return "done"

    def outcome(post: Any) -> list[str]:
        seen.clear()
        contexts.clear()
        response = post(scenario)
        assert response.status_code == 201, response.content[:300]
        contexts[0].__exit__(None, None, None)  # the middleware leaves it now
        rest = list(connection.execute_wrappers)
        Widget.objects.all().delete()
        assert rest == []
        return list(seen)

    baseline = outcome(post_unkeyed_in_atomic)
    assert baseline[-1] == "INSERT"  # the on_commit one
    keyed = outcome(post_keyed)
    # the keyed run also has the record's statements: compare the view's INSERTs
    assert keyed.count("INSERT") == baseline.count("INSERT") == 2, (baseline, keyed)


def rolled_back_unseen(rollback: Callable[[str], None]) -> Callable[[], Any]:
    """A write, a manual savepoint, a block inside it whose savepoint ``rollback``
    destroys (by rolling back to, or releasing, the manual one) with a statement the
    wrapper does not read; the view catches the block's error, if any."""

    def scenario() -> Any:
        Widget.objects.create(name="before")
        sid = new_savepoint()
        try:
            with transaction.atomic():
                Widget.objects.create(name="inside")
                rollback(sid)
        except DatabaseError as exc:  # the block's release: its savepoint is gone
            return type(exc.__cause__).__name__
        return "clean"

    return scenario


def composed(sid: str) -> None:
    """psycopg's ``sql`` module (Django's cursors take a Composed): not a str."""
    with connection.cursor() as cursor:
        cursor.execute(pgsql.SQL("ROLLBACK TO SAVEPOINT {}").format(pgsql.Identifier(sid)))


def with_params(sid: str) -> None:
    """Django's own statement text, run with ``params=[]``."""
    with connection.cursor() as cursor:
        cursor.execute(connection.ops.savepoint_rollback_sql(sid), [])


def past_the_wrappers(sid: str) -> None:
    """Through the driver's connection."""
    connection.connection.execute(connection.ops.savepoint_rollback_sql(sid))


def hand_written_release(sid: str) -> None:
    """Unquoted, lower case: the same savepoint. Releasing the manual savepoint also
    destroys the block's, opened inside it."""
    with connection.cursor() as cursor:
        cursor.execute(f"RELEASE SAVEPOINT {sid}")


PAST_THE_WRAPPERS = pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/storage.md, the view's savepoints): savepoint SQL sent "
    "through the driver's connection, past Django's wrappers, is not seen",
)


@pytest.mark.parametrize(
    "destroy",
    [
        composed,
        with_params,
        pytest.param(past_the_wrappers, marks=PAST_THE_WRAPPERS),
        hand_written_release,
    ],
)
def test_a_release_of_a_savepoint_destroyed_unseen_fails_at_the_block_exit(destroy):
    """Without the app the block's RELEASE fails at the block's exit: the view catches
    InvalidSavepointSpecification there, and its transaction is doomed (Django marks it
    for rollback): nothing commits. So it must with the app: SQL of the view's own that
    may release or roll back savepoints stops the wrapper holding releases of those
    placed before it. (What this rules out: the wrapper holding the release of the
    destroyed savepoint: the block exited cleanly and the view's writes committed.)"""
    assert same(rolled_back_unseen(destroy)) == ("ok", "InvalidSavepointSpecification", [])


def test_a_savepoint_destroyed_unseen_end_to_end():
    """Keyed: unkeyed, the view's transaction is doomed and nothing commits; keyed, the
    view's writes commit and its response is stored."""
    scenario = rolled_back_unseen(composed)
    baseline = post_unkeyed_in_atomic(scenario)
    assert baseline.status_code == 201
    assert baseline.json() == {"result": "InvalidSavepointSpecification"}
    assert committed() == []
    keyed = post_keyed(scenario)
    assert keyed.json() == baseline.json()
    assert committed() == []


def close_then_statement_on_an_open_cursor() -> Any:
    """A cursor opened before, a block, ``connection.close()``, then the cursor used."""
    with connection.cursor() as cursor:
        with transaction.atomic():
            Widget.objects.create(name="a")
        connection.close()
        try:
            cursor.execute("SELECT 1")
        except Exception as exc:
            return type(exc).__name__
    return "no error"


def test_a_statement_after_close_raises_as_without_the_app():
    """Django refuses the statement (TransactionManagementError: the transaction is
    broken), with the app too. (What this rules out: the held release sent first, on the
    closed driver connection: an OperationalError came out instead.)"""
    same(close_then_statement_on_an_open_cursor)


def killed_between_release_and_next_statement() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    terminate(connection.connection.info.backend_pid)
    try:
        Widget.objects.count()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


@NOT_POOLED
def test_a_connection_killed_while_a_release_is_held():
    outcome = run(killed_between_release_and_next_statement, app=False)
    connection.close()
    with_app = run(killed_between_release_and_next_statement, app=True)
    connection.close()
    assert with_app == outcome == ("raised", "OperationalError", [])


@NOT_POOLED
def test_a_connection_killed_while_a_release_is_held_end_to_end():
    """Keyed: the view's next statement fails either way; the request raises (500) and
    nothing commits, as unkeyed."""

    def scenario() -> Any:
        with transaction.atomic():
            Widget.objects.create(name="a")
        terminate(connection.connection.info.backend_pid)
        return Widget.objects.count()

    outcomes = []
    for post in (post_unkeyed_in_atomic, post_keyed):
        try:
            response = post(scenario)
            outcomes.append(response.status_code)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
        connection.close()
    assert outcomes[0] == outcomes[1] == 500, outcomes
    assert committed() == []
    assert IdempotencyRecord.objects.filter(state="completed").count() == 0


def logging_switched_on_after_a_release() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    connection.force_debug_cursor = True
    try:
        connection.queries_log.clear()
        Widget.objects.count()
        logged = [q["sql"].split()[0] for q in connection.queries_log]
    finally:
        connection.force_debug_cursor = False
    return logged


def test_the_log_switched_on_after_a_held_release_shows_the_views_statement():
    assert same(logging_switched_on_after_a_release) == ("ok", ["SELECT"], ["a"])


def logging_switched_off_inside_a_block() -> Any:
    connection.force_debug_cursor = True
    try:
        connection.queries_log.clear()
        with transaction.atomic():
            Widget.objects.create(name="a")
            connection.force_debug_cursor = False
        Widget.objects.count()
        connection.force_debug_cursor = True
        Widget.objects.exists()
        logged = [q["sql"].split()[0] for q in connection.queries_log]
    finally:
        connection.force_debug_cursor = False
    return logged


def test_the_log_switched_off_inside_a_block():
    assert same(logging_switched_off_inside_a_block) == (
        "ok",
        ["SAVEPOINT", "INSERT", "SELECT"],
        ["a"],
    )


def reentrant_wrapper() -> Any:
    """A wrapper of the view's own that runs SQL of its own for each statement."""
    seen: list[str] = []
    busy: list[bool] = []

    def audit(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if busy:
            return execute(sql, params, many, context)
        busy.append(True)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT txid_current_if_assigned() IS NOT NULL")
                seen.append(f"{str(sql).split()[0]}:{cursor.fetchone()[0]}")
        finally:
            busy.clear()
        return execute(sql, params, many, context)

    with transaction.atomic():
        Widget.objects.create(name="a")
    with connection.execute_wrapper(audit):
        with transaction.atomic():
            Widget.objects.create(name="b")
        Widget.objects.count()
    with transaction.atomic():
        Widget.objects.create(name="c")
    return seen


def test_a_wrapper_of_the_views_own_that_runs_sql():
    assert same(reentrant_wrapper)[0] == "ok"


def test_a_wrapper_around_the_apps_that_runs_sql_of_its_own():
    """A wrapper outside the app's (installed before it, e.g. by middleware), that runs
    a query of its own before each statement: the app's wrapper is the innermost, so it
    holds releases; the outer wrapper's own query (through the app's too) sends them
    first, in order."""
    busy: list[bool] = []
    seen: list[Any] = []

    def audit(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        if not busy:
            busy.append(True)
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM testapp_widget")
                    seen.append((str(sql).split()[0], cursor.fetchone()[0]))
            finally:
                busy.clear()
        return execute(sql, params, many, context)

    def scenario() -> Any:
        with transaction.atomic():
            Widget.objects.create(name="a")
        with contextlib.suppress(ValueError), transaction.atomic(), transaction.atomic():
            Widget.objects.create(name="lost")
            raise ValueError
        with transaction.atomic(), transaction.atomic():
            Widget.objects.create(name="b")
        return Widget.objects.count()

    outcomes = []
    for app in (False, True):
        seen.clear()
        with connection.execute_wrapper(audit):
            result = run(scenario, app=app)
        outcomes.append((result, list(seen)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ("ok", 2, ["a", "b"])


def counter_reset_mid_view() -> Any:
    """``transaction.clean_savepoints()`` resets the id counter: names repeat."""
    with transaction.atomic():
        Widget.objects.create(name="a")
        transaction.clean_savepoints()
        sid = new_savepoint()
        with transaction.atomic():
            Widget.objects.create(name="b")
        transaction.savepoint_rollback(sid)
        with transaction.atomic():
            Widget.objects.create(name="c")
        transaction.savepoint_commit(sid)
    transaction.clean_savepoints()
    with transaction.atomic(), transaction.atomic():
        Widget.objects.create(name="d")
    return Widget.objects.count()


def test_savepoint_ids_repeated_after_clean_savepoints():
    assert same(counter_reset_mid_view) == ("ok", 3, ["a", "c", "d"])


def manual_savepoint_left_open() -> Any:
    sid = new_savepoint()
    Widget.objects.create(name="a")
    transaction.savepoint_commit(sid)
    sid2 = new_savepoint()
    Widget.objects.create(name="lost")
    transaction.savepoint_rollback(sid2)
    new_savepoint()  # left open
    Widget.objects.create(name="b")
    return Widget.objects.count()


def test_manual_savepoints_outside_any_block_of_the_view():
    assert same(manual_savepoint_left_open) == ("ok", 2, ["a", "b"])


def other_alias_between() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    with transaction.atomic(using="shard"), connections["shard"].cursor() as cursor:
        cursor.execute("SELECT 1")
    with transaction.atomic(using="default"):
        Widget.objects.create(name="b")
    return Widget.objects.count()


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_statements_on_another_alias_between_blocks():
    assert same(other_alias_between) == ("ok", 2, ["a", "b"])


def release_with_empty_params() -> Any:
    with transaction.atomic():
        sid = new_savepoint()
        Widget.objects.create(name="a")
        with connection.cursor() as cursor:
            cursor.execute(connection.ops.savepoint_commit_sql(sid), ())
            status = cursor.statusmessage
    return status


def test_a_release_of_djangos_text_with_empty_params_is_run():
    assert same(release_with_empty_params) == ("ok", "RELEASE", ["a"])


def set_autocommit_misuse() -> Any:
    with transaction.atomic():
        Widget.objects.create(name="a")
    try:
        transaction.set_autocommit(True)
    except transaction.TransactionManagementError as exc:
        refused = type(exc).__name__
    Widget.objects.create(name="b")
    return refused


def test_set_autocommit_refused_inside_the_view():
    assert same(set_autocommit_misuse) == ("ok", "TransactionManagementError", ["a", "b"])


def test_an_async_view_with_blocks_end_to_end(settings):
    """``/async`` with a key: what it stores matches what it answers."""
    token_mod = __import__("tests.support.factories", fromlist=["TokenFactory"])
    from tests.support.concurrency import token_client

    token = token_mod.TokenFactory(user__username=f"held-releases-{uuid.uuid4().hex[:8]}")
    client = token_client(token.key)
    key = str(uuid.uuid4())
    first = client.post("/async", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = client.post("/async", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code < 500, first.content[:300]
    assert again.content == first.content


def copy_after_release_then_failure_caught() -> Any:
    """A held release, a COPY that fails (past the wrappers) and is caught inside a
    block, then the block's exit; without the app the release went out before."""
    with transaction.atomic():
        Widget.objects.create(name="a")
    try:
        with transaction.atomic():
            with (
                contextlib.suppress(Exception),
                connection.cursor() as cursor,
                cursor.cursor.copy("COPY testapp_widget (name, size) FROM STDIN") as cp,
            ):
                cp.write_row(["bad", "x"])
            Widget.objects.create(name="b")
    except DatabaseError as exc:
        caught = type(exc.__cause__).__name__
    Widget.objects.create(name="c")
    return caught


def test_a_failed_copy_after_a_held_release():
    assert same(copy_after_release_then_failure_caught)[1] == "InFailedSqlTransaction"


def select_for_update_after_release() -> Any:
    admin = admin_connection()
    try:
        with transaction.atomic():
            Widget.objects.create(name="a")
        names = [w.name for w in Widget.objects.select_for_update().iterator(chunk_size=1)]
        return names
    finally:
        admin.close()


def test_select_for_update_iterator_after_a_block():
    assert same(select_for_update_after_release) == ("ok", ["a"], ["a"])


def pipelined_failure_after_a_block() -> Any:
    """A held release, then a pipeline whose statement fails (psycopg raises at the
    pipeline's sync); the view catches it inside a block of its own."""
    with transaction.atomic():
        Widget.objects.create(name="a")
    try:
        with connection.connection.pipeline(), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    except Exception as exc:
        caught = type(exc).__name__
    return [caught, connection.connection.info.transaction_status.name]


def test_a_failing_statement_in_a_pipeline_after_a_held_release():
    assert same(pipelined_failure_after_a_block)[0] == "ok"
