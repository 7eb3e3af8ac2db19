"""The view's first ``SAVEPOINT`` goes with the transaction's ``BEGIN``, and its
``RELEASE SAVEPOINT`` statements are sent late, in order, or not at all
(``django_idempotency.transactions.savepoints``): what PostgreSQL receives, and that
the view's blocks behave exactly as without the app."""

from __future__ import annotations

import contextlib
import re
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord
from django_idempotency.transactions import savepoints
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.faults import admin_connection
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

NAMES = ["between", "first", "last"]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement psycopg sends (Django's cursors are psycopg ClientCursors), and
    the first savepoint sent with the ``BEGIN`` on the libpq connection."""
    seen: list[str] = []
    real = psycopg.ClientCursor.execute
    real_begin = savepoints.ViewSavepoints._begin_with

    def spy(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        seen.append(str(query))
        return real(self, query, params, **kwargs)

    def begin_spy(self: Any, sql: str) -> None:
        seen.append(f"BEGIN; {sql}")
        real_begin(self, sql)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", spy)
    monkeypatch.setattr(savepoints.ViewSavepoints, "_begin_with", begin_spy)
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
    """The view's first block opens the transaction: its SAVEPOINT goes with the BEGIN,
    in one query, and psycopg sends no BEGIN of its own."""
    key = str(uuid.uuid4())
    response = post(key, sent, commands)
    assert response.status_code == 201, response.content
    assert set(response.json()) == {"last"}
    first = next(i for i, sql in enumerate(sent) if sql.startswith("BEGIN; SAVEPOINT"))
    order = kinds(sent[first:])
    assert commands == []  # no BEGIN of psycopg's; no COMMIT of its own: the completion's
    # first block: BEGIN and SAVEPOINT, INSERT, its release held until the next
    # statement; failing block: SAVEPOINT, INSERT, INSERT (refused), ROLLBACK TO and
    # RELEASE at once (Django's own handling); the write between; the last two blocks:
    # their releases are held and dropped, the COMMIT that follows releases them.
    assert order[:5] == ["BEGIN", "SAVEPOINT", "INSERT", "RELEASE", "SAVEPOINT"]
    order = order[1:]
    assert order[4:8] == ["INSERT", "INSERT", "ROLLBACK TO", "RELEASE"]
    assert order[8:11] == ["INSERT", "SAVEPOINT", "SAVEPOINT"]
    assert order[11:] == ["INSERT", "SELECT", "COMMIT"]  # the completion carries COMMIT
    assert sorted(Widget.objects.values_list("name", flat=True)) == NAMES  # and only
    assert IdempotencyRecord.objects.get().state == "completed"
    replay = post(key)  # another user's token: another principal, so it runs again
    assert replay.status_code == 201


@pytest.mark.postgres
def test_a_first_savepoint_follows_psycopgs_own_begin_when_that_begin_is_not_plain(sent, commands):
    """With an isolation level set on the driver's connection, psycopg's ``BEGIN`` says
    it, so it goes as psycopg sends it, and the view's first savepoint after it."""
    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        response = post(str(uuid.uuid4()), sent, commands)
    finally:
        raw.isolation_level = None
    assert response.status_code == 201, response.content
    assert commands == [b"BEGIN ISOLATION LEVEL READ COMMITTED"]
    assert not any(sql.startswith("BEGIN") for sql in sent)
    assert IdempotencyRecord.objects.get().state == "completed"


@pytest.mark.postgres
def test_while_queries_are_logged_the_first_savepoint_follows_psycopgs_begin(sent, commands):
    """``CaptureQueriesContext`` (or ``DEBUG``) sees the statements as Django makes them:
    psycopg sends its own ``BEGIN`` and the savepoint goes alone."""
    with CaptureQueriesContext(connection) as logged:
        response = post(str(uuid.uuid4()), sent, commands)
    assert response.status_code == 201, response.content
    assert commands == [b"BEGIN"]
    assert not any(sql.startswith("BEGIN") for sql in sent)
    assert any(q["sql"].startswith("SAVEPOINT") for q in logged.captured_queries)


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
    from django.db import DatabaseError, transaction

    with transaction.atomic(), connection.execute_wrapper(wrapper):
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


@pytest.mark.postgres
def test_a_wrapper_of_the_views_own_sees_each_release_as_it_comes(sent):
    """Inside a wrapper the view installed, nothing is held: that wrapper sees the
    block's statements in Django's order, the release at the block's end."""
    wrapper = savepoints.ViewSavepoints(connection)
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with connection.execute_wrapper(record):
            with transaction.atomic():
                Widget.objects.create(name="seen")
            assert kinds(seen) == ["SAVEPOINT", "INSERT", "RELEASE"]
            assert wrapper.held == []
        with transaction.atomic():
            Widget.objects.create(name="held")
        assert len(wrapper.held) == 1  # no wrapper inside this one any more
        transaction.set_rollback(True)


@pytest.mark.postgres
def test_held_releases_go_out_one_per_query_in_pipeline_mode():
    """psycopg's pipeline mode takes one statement per query."""
    wrapper = savepoints.ViewSavepoints(connection)
    with transaction.atomic(), connection.execute_wrapper(wrapper):
        with transaction.atomic(), transaction.atomic():
            Widget.objects.create(name="inner")
        assert len(wrapper.held) == 2
        with connection.connection.pipeline():
            Widget.objects.create(name="piped")
        assert wrapper.held == []
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["inner", "piped"]


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


# --- SQL of the view's own that looks like Django's ------------------------------------


def _savepoint_user(request: Any) -> str:
    return "savepoint-user"


@csrf_exempt
@idempotent(principal=_savepoint_user)
def release_then_insert(request: HttpRequest) -> JsonResponse:
    """Its last statement begins like Django's release and goes on with an INSERT."""
    # Django's statement: a savepoint the wrapper tracks (``savepoint_create`` from 6.1)
    sid = getattr(transaction, "savepoint_create", transaction.savepoint)()
    with connection.cursor() as cursor:
        cursor.execute(
            f'RELEASE SAVEPOINT "{sid}"; '
            "INSERT INTO testapp_widget (name, size) VALUES ('after the release', 0)"
        )
    return JsonResponse({"released": sid}, status=201)


@csrf_exempt
@idempotent(principal=_savepoint_user)
def releases_its_block(request: HttpRequest) -> JsonResponse:
    """Releases its own block's savepoint with SQL of its own (``X-Release`` spelling);
    Django's release at the block's end then fails, as it does without the app."""
    with transaction.atomic():
        Widget.objects.create(name="inside the block")
        sid = connection.savepoint_ids[-1]
        with connection.cursor() as cursor:
            cursor.execute(request.headers["X-Release"].format(name=f'"{sid}"'))
    return JsonResponse({}, status=201)


urlpatterns = [
    path("release-then-insert", release_then_insert),
    path("releases-its-block", releases_its_block),
]


@pytest.mark.postgres
@pytest.mark.urls(__name__)
def test_sql_that_begins_like_djangos_release_and_goes_on_is_never_held():
    """A view's own statement ``RELEASE SAVEPOINT "s…_x…"; INSERT ...`` is sent as it
    is, never held back nor dropped as if it were Django's release: its row is
    there, committed with the response."""
    key = str(uuid.uuid4())
    client = Client(raise_request_exception=False)
    response = client.post("/release-then-insert", {}, HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.content
    assert Widget.objects.filter(name="after the release").count() == 1
    assert IdempotencyRecord.objects.get().state == "completed"


@pytest.mark.postgres
@pytest.mark.urls(__name__)
@pytest.mark.parametrize("spelling", ["RELEASE {name}", "RELEASE SAVEPOINT {name}"])
def test_a_views_own_release_ends_the_holding_in_either_spelling(spelling: str):
    """``RELEASE name`` (SAVEPOINT is optional in PostgreSQL) releases the block's
    savepoint as ``RELEASE SAVEPOINT name`` does: Django's release at the block's end
    is then sent at once and fails there, as without the app. The view fails (500),
    nothing of it commits and the key is released, instead of a stored 201."""
    key = str(uuid.uuid4())
    client = Client(raise_request_exception=False)
    headers = {"HTTP_IDEMPOTENCY_KEY": key, "HTTP_X_RELEASE": spelling}
    response = client.post("/releases-its-block", {}, **headers)
    assert response.status_code == 500
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert client.post("/releases-its-block", {}, **headers).status_code == 500  # ran again
