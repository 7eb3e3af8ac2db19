"""The write guard (``django_idempotency.transactions.write_guard``) against every way a
single-transaction view whose record is on ``shard`` can write to ``default``: a
streamed body, ``on_commit`` callbacks, worker threads, statements whose first keyword
is not a write, nested comments, composed and bytes queries, ``SELECT ... INTO``,
psycopg's COPY, locking reads and the ORM's bulk writes, on PostgreSQL. A refused write
is not stored; a read is left alone.

Three documented limits (docs/deployment.md) are strict ``xfail`` tests: they fail
while the limit stands."""

from __future__ import annotations

import uuid

import pytest

from django_idempotency.models import IdempotencyRecord
from django_idempotency.transactions.write_guard import writes
from tests.support.faults import direct_presence  # noqa: F401  (the fixture)
from tests.support.testapp.models import Widget
from tests.support.two_database_app import (
    RAW_SQL,
    completed,
    post,
    widgets,
)

pytestmark = [
    pytest.mark.usefixtures("direct_presence"),
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
    pytest.mark.urls("tests.support.two_database_app"),
]


def test_a_streaming_bodys_write_to_another_database_is_refused() -> None:
    """A single-transaction view whose record is on ``shard`` returns a
    ``StreamingHttpResponse`` whose body generator writes a row to ``default``. The body
    is consumed after the view returns (``responses.snapshot``), and the write is
    refused all the same: nothing lands on ``default`` and no response is stored (an
    effect outside the record's transaction is what the guard exists to prevent)."""
    key = str(uuid.uuid4())
    post("/streams", key)
    assert widgets("default") == 0, "the streamed body wrote to default unguarded"
    assert completed("shard") == 0, "a response with an unguarded write was stored"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/deployment.md): "
        "on_commit callbacks run after the view's transaction, outside the guard"
    ),
)
def test_an_on_commit_callbacks_write_to_another_database_is_refused() -> None:
    """A view registers ``transaction.on_commit(..., using="shard")`` that writes to
    ``default``: the write would be refused. A documented limit (strict xfail,
    docs/deployment.md): the callback runs after the record's transaction committed,
    outside the guard; if it fails (or the process dies before it), every retry replays
    a completed response whose effect on ``default`` never happened."""
    key = str(uuid.uuid4())
    post("/on-commit", key)
    assert widgets("default") == 0, "an on_commit callback wrote to default unguarded"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/deployment.md): threads the view starts have their own connections"
    ),
)
def test_a_write_from_a_thread_the_view_starts_is_refused() -> None:
    """A single-transaction view hands a write to ``default`` to a worker thread and waits for
    it: the write would be refused and nothing stored. A documented limit (strict xfail,
    docs/deployment.md): Django's connections are per thread, the worker's has no
    execute wrapper, so the row commits on its own and the response is stored."""
    key = str(uuid.uuid4())
    post("/worker-thread", key)
    assert widgets("default") == 0, "a worker thread's write to default went through"
    assert completed("shard") == 0


@pytest.mark.parametrize("name", ["explain-analyze", "prepare-execute", "select-then-insert"])
def test_statements_that_write_behind_another_first_keyword_are_refused(name: str) -> None:
    """Statements PostgreSQL executes as writes are refused though their first keyword is not a
    write: ``EXPLAIN ANALYZE INSERT`` (EXPLAIN ANALYZE runs the statement), ``PREPARE
    ... ; EXECUTE``, and a write after a first read in one multi-statement string
    (``SELECT 1; INSERT ...``: psycopg 3's client-side cursor, Django's default, sends
    it as one simple query). Nothing lands on ``default``, nothing is stored on
    ``shard``."""
    key = str(uuid.uuid4())
    post("/raw", key, HTTP_X_SQL=name)
    assert widgets("default") == 0, f"{RAW_SQL[name]!r} wrote to default unguarded"
    assert completed("shard") == 0


def test_a_write_behind_a_nested_block_comment_is_refused() -> None:
    """PostgreSQL nests ``/* */`` comments; the INSERT behind a nested comment is still seen as
    a write and refused."""
    key = str(uuid.uuid4())
    post("/raw", key, HTTP_X_SQL="nested-comment")
    assert widgets("default") == 0
    assert completed("shard") == 0


def test_a_composed_psycopg_query_that_writes_is_refused() -> None:
    """``write_guard.writes`` judges "a string, or a composed psycopg query": a
    ``psycopg.sql.Composed`` INSERT into ``default`` (``sql.SQL(...).format(...)``,
    psycopg's safe way to put an identifier into a statement) is judged by the SQL it
    renders to, not by its repr (whose first word is ``Composed``), and refused; nothing
    is stored."""
    key = str(uuid.uuid4())
    post("/composed", key)
    assert widgets("default") == 0, "a composed INSERT wrote to default unguarded"
    assert completed("shard") == 0


def test_a_bytes_query_that_writes_is_judged_a_write() -> None:
    """psycopg accepts a query as ``bytes``: ``b"INSERT ..."`` is judged a write (by its text,
    not by ``str(b"...")``, whose first word is ``b``)."""
    assert writes(b"INSERT INTO testapp_widget (name, size) VALUES ('b', 0)")


def test_select_into_is_judged_a_write() -> None:
    """``SELECT ... INTO`` creates a table (a DDL effect, like the ``CREATE`` the guard
    refuses): ``writes()`` judges it a write though it starts with SELECT."""
    assert writes(RAW_SQL["select-into"]), "SELECT ... INTO creates a table"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/deployment.md): "
        "psycopg's cursor.copy() bypasses Django's execute wrappers"
    ),
)
def test_psycopg_copy_through_djangos_cursor_is_refused() -> None:
    """``cursor.copy("COPY ... FROM STDIN")`` on Django's own cursor wrapper (psycopg 3's
    bulk-load API, reached through ``CursorWrapper.__getattr__``) would be refused like
    any COPY. A documented limit (strict xfail, docs/deployment.md): it never goes
    through ``execute_wrapper``, so the guard does not see it; the rows land on
    ``default`` and the response is stored."""
    key = str(uuid.uuid4())
    post("/copies", key)
    assert widgets("default") == 0, "COPY via cursor.copy() wrote to default unguarded"
    assert completed("shard") == 0


def test_a_cte_read_with_a_locking_clause_is_left_alone() -> None:
    """A read of ``default`` written as a CTE with a locking clause (``WITH ids AS (...) SELECT
    ... FOR UPDATE OF t``) is a read, as the same read without the CTE: the ``FOR
    UPDATE`` is not an ``UPDATE``, and the view answers 201."""
    assert not writes("SELECT t.id FROM testapp_widget t FOR UPDATE OF t")  # consistent
    assert not writes(
        "WITH ids AS (SELECT id FROM testapp_widget) "
        "SELECT t.id FROM testapp_widget t JOIN ids USING (id) FOR UPDATE OF t"
    ), "a locking read with a CTE is judged a write"
    response = post("/cte-read", str(uuid.uuid4()))
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "way",
    ["bulk_create", "get_or_create", "update_or_create", "update", "delete", "executemany",
     "cte"],
)  # fmt: skip
def test_orm_and_cursor_writes_to_another_database_are_refused_even_if_caught(way: str) -> None:
    """bulk_create, get_or_create, update_or_create, QuerySet.update and .delete, executemany
    behind leading comments, and a data-modifying CTE, each to ``default`` from a view
    whose record is on ``shard``, are refused before they reach the server; the view
    catches the refusal and answers 201 anyway, and nothing is stored (the key is
    released)."""
    Widget.objects.using("default").create(name="existing")
    before = list(Widget.objects.using("default").values_list("name", "size"))
    response = post("/orm", str(uuid.uuid4()), HTTP_X_WAY=way)
    assert response.status_code == 500  # CrossDatabaseWrite raised again by check()
    assert list(Widget.objects.using("default").values_list("name", "size")) == before
    assert IdempotencyRecord.objects.using("shard").count() == 0
