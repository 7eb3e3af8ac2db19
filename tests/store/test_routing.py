"""Where the records live: the view's database, per view and per request, and writes
to any other database refused while a view runs (docs/deployment.md).

``shard`` (tests/settings.py) is a second real primary database, migrated like
``default``: a tenant's shard, or the database a router sends the records to. On
PostgreSQL both are real PostgreSQL databases on the test server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from hypothesis import given
from hypothesis import strategies as st

from django_idempotency import outbox, store
from django_idempotency.checks.databases import (
    check_database_aliases,
    check_record_placement,
    check_view_databases,
)
from django_idempotency.exceptions import CrossDatabaseWrite
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.protocol.decorators import idempotent
from django_idempotency.store.routing import all_databases
from django_idempotency.transactions.write_guard import writes
from tests.support.concurrency import Runner
from tests.support.testapp.models import Widget

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
    pytest.mark.urls("tests.store.test_routing"),
    pytest.mark.pooled,
]

PRINCIPAL = "tenant-user"


def principal(request: Any) -> str:
    return PRINCIPAL


def tenant(request: Any) -> str:
    """A tenant-sharded project's choice: the tenant's database, from the request."""
    return request.headers.get("X-Tenant", "default")


class RecordsElsewhere:
    """A router that keeps the app's tables on ``shard`` and everything else on default."""

    def _route(self, model: Any, **hints: Any) -> str | None:
        return "shard" if model._meta.app_label == "django_idempotency" else None

    db_for_read = db_for_write = _route

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True


# --- views ------------------------------------------------------------------------

HELD = threading.Event()
OPEN = threading.Event()


def _created(widget: Widget) -> JsonResponse:
    return JsonResponse({"id": widget.pk, "db": widget._state.db}, status=201)


@idempotent(principal=principal, using="shard")
def on_shard(request: HttpRequest) -> JsonResponse:
    if request.headers.get("X-Hold"):
        HELD.set()
        assert OPEN.wait(30)
    widget = Widget.objects.using("shard").create(name="on-shard")
    outbox.enqueue("widget.created", {"id": widget.pk})
    return _created(widget)


@idempotent(principal=principal, using=tenant)
def per_tenant(request: HttpRequest) -> JsonResponse:
    return _created(Widget.objects.using(tenant(request)).create(name="per-tenant"))


@idempotent(principal=principal)
def on_default(request: HttpRequest) -> JsonResponse:
    """Writes its row to ``default``: with RecordsElsewhere, its record is on shard."""
    widget = Widget.objects.create(name="order")
    if request.headers.get("X-Fail"):
        raise RuntimeError("the view failed after its write")
    return _created(widget)


@idempotent(principal=principal)
def swallows(request: HttpRequest) -> JsonResponse:
    """Catches the refusal and claims success anyway."""
    with contextlib.suppress(CrossDatabaseWrite):
        Widget.objects.create(name="order")
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal)
def reads_default(request: HttpRequest) -> JsonResponse:
    """Reads from ``default`` (allowed) and writes nothing there."""
    return JsonResponse({"widgets": Widget.objects.using("default").count()}, status=201)


#: Reads of ``default`` that use write keywords as names, run by ``/reads-sql``. Each is
#: valid on SQLite and PostgreSQL; the second group needs PostgreSQL.
READS = {
    "function": "SELECT replace (name, 'a', 'b') FROM testapp_widget",
    "alias": "SELECT count(*) AS merge FROM testapp_widget",
    "cte-name": "WITH merge AS (SELECT name FROM testapp_widget) "
    "SELECT replace(name, 'a', 'b') AS \"update\" FROM merge",
    "literal": "SELECT name FROM testapp_widget WHERE name <> 'insert into x; delete'",
    "comment": "/* delete from testapp_widget */ SELECT count(*) FROM testapp_widget",
}
PG_READS = {
    "locking-cte": "WITH ids AS MATERIALIZED (SELECT id FROM testapp_widget) "
    "SELECT t.id FROM testapp_widget t JOIN ids USING (id) FOR NO KEY UPDATE OF t",
    "explain": "EXPLAIN INSERT INTO testapp_widget (name, size) VALUES ('x', 0)",
    "explain-analyze-off": "EXPLAIN (ANALYZE false, COSTS off) DELETE FROM testapp_widget",
    "search": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) "
    "SEARCH DEPTH FIRST BY i SET ord SELECT count(*) AS delete FROM n",
    "dollar": "SELECT $q$ insert into testapp_widget $q$ AS copy",
}


@idempotent(principal=principal)
def reads_sql(request: HttpRequest) -> JsonResponse:
    """Runs the read ``X-Read`` names on ``default`` (its record is on shard)."""
    sql = {**READS, **PG_READS}[request.headers["X-Read"]]
    with connections["default"].cursor() as cursor:
        cursor.execute(sql)
        rows = len(cursor.fetchall())
    return JsonResponse({"rows": rows}, status=201)


@idempotent(principal=principal)
def notifies(request: HttpRequest) -> JsonResponse:
    """Sends ``NOTIFY`` on ``default`` (its record is on shard): a write of a kind."""
    with connections["default"].cursor() as cursor:
        cursor.execute("NOTIFY widgets_changed, 'from the view'")
    return JsonResponse({}, status=201)


@idempotent(principal=principal, phases=["write"])
def phased(request: HttpRequest) -> JsonResponse:
    """A phased view: each phase commits on its own, a write elsewhere is an effect."""
    with request.idempotency.phase("write"):  # type: ignore[attr-defined]
        widget = Widget.objects.using("default").create(name="phased")
    return _created(widget)


urlpatterns = [
    path("on-shard", on_shard),
    path("per-tenant", per_tenant),
    path("on-default", on_default),
    path("swallows", swallows),
    path("reads-default", reads_default),
    path("phased", phased),
    path("reads-sql", reads_sql),
    path("notifies", notifies),
]


def post(url: str, key: str, *, client: Client | None = None, **headers: str) -> Any:
    client = client or Client(raise_request_exception=False)
    return client.post(
        url, {"n": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **headers
    )


def records(alias: str) -> int:
    return IdempotencyRecord.objects.using(alias).count()


def widgets(alias: str) -> int:
    return Widget.objects.using(alias).count()


@pytest.fixture
def records_on_shard(settings: Any) -> None:
    settings.DATABASE_ROUTERS = ["tests.store.test_routing.RecordsElsewhere"]


@pytest.fixture
def atomic_requests(monkeypatch: Any, settings: Any) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)


# --- 1. the record is where the writes are -------------------------------------------


def test_a_view_with_using_keeps_its_record_and_outbox_next_to_its_writes():
    key = str(uuid.uuid4())
    first = post("/on-shard", key)
    assert first.status_code == 201 and first.json()["db"] == "shard"
    replay = post("/on-shard", key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    assert (records("shard"), records("default")) == (1, 0)
    assert (widgets("shard"), widgets("default")) == (1, 0)
    # The outbox message went into the view's transaction, on the shard.
    message = OutboxMessage.objects.using("shard").get()
    assert message.record_id == IdempotencyRecord.objects.using("shard").get().pk
    assert not OutboxMessage.objects.using("default").exists()


def test_a_duplicate_on_the_shard_sees_the_claim_while_the_original_runs():
    key = str(uuid.uuid4())
    HELD.clear()
    OPEN.clear()
    runner = Runner()
    runner.start(lambda: post("/on-shard", key, HTTP_X_HOLD="1"))
    try:
        assert HELD.wait(30)
        assert post("/on-shard", key).status_code == 409  # the claim committed on the shard
    finally:
        OPEN.set()
    (first,) = runner.join()
    assert first.status_code == 201
    assert post("/on-shard", key)["Idempotent-Replayed"] == "true"
    assert widgets("shard") == 1


def test_a_per_request_choice_keeps_each_tenants_records_in_its_shard():
    key = str(uuid.uuid4())  # the same key in two tenants: two operations, one per shard
    for alias in ("default", "shard"):
        first = post("/per-tenant", key, HTTP_X_TENANT=alias)
        assert first.status_code == 201 and first.json()["db"] == alias
        again = post("/per-tenant", key, HTTP_X_TENANT=alias)
        assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert (records("default"), records("shard")) == (1, 1)
    assert (widgets("default"), widgets("shard")) == (1, 1)


def test_the_resolver_setting_chooses_for_every_view(settings: Any):
    settings.IDEMPOTENCY = {"DATABASE_RESOLVER": "tests.store.test_routing.tenant"}
    key = str(uuid.uuid4())
    response = post("/reads-default", key, HTTP_X_TENANT="shard")
    assert response.status_code == 201
    assert (records("shard"), records("default")) == (1, 0)


def test_a_choice_that_names_no_database_is_a_configuration_error_and_claims_nothing():
    client = Client()  # raises what the view raised
    with pytest.raises(ImproperlyConfigured, match=r"'nowhere'.*not a database alias"):
        post("/per-tenant", str(uuid.uuid4()), client=client, HTTP_X_TENANT="nowhere")
    assert (records("default"), records("shard")) == (0, 0)


def test_the_router_default_puts_records_where_it_routes_them(records_on_shard: None):
    key = str(uuid.uuid4())
    assert post("/reads-default", key).status_code == 201
    assert (records("shard"), records("default")) == (1, 0)
    assert post("/reads-default", key)["Idempotent-Replayed"] == "true"


# --- 2. writes to another database are refused ---------------------------------------


def test_with_atomic_requests_a_write_elsewhere_is_refused_even_if_completion_fails(
    records_on_shard: None, atomic_requests: None, monkeypatch: Any
):
    """Once: the request's transaction on default committed the order although the
    completion failed (503), and the retry made a second order."""

    def failing_complete(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("the completion failed")

    monkeypatch.setattr(store, "complete", failing_complete)
    key = str(uuid.uuid4())
    for _ in range(2):
        response = post("/on-default", key)
        assert response.status_code == 500  # a configuration error, not a 503 to retry
        assert widgets("default") == 0
    assert records("shard") == 0  # released: nothing stands for an order


def test_with_atomic_requests_no_replay_ever_stands_for_a_write_that_did_not_commit(
    records_on_shard: None, atomic_requests: None
):
    """Once: the record completed on its database while default's commit failed, and
    every retry replayed a 201 for an order that did not exist."""
    key = str(uuid.uuid4())
    assert post("/on-default", key).status_code == 500
    retry = post("/on-default", key)
    assert retry.status_code == 500 and "Idempotent-Replayed" not in retry
    assert widgets("default") == 0
    assert not IdempotencyRecord.objects.using("shard").filter(state="completed").exists()


def test_without_atomic_requests_a_view_that_writes_then_raises_keeps_nothing(
    records_on_shard: None,
):
    """Once: the write committed in autocommit mode, the view raised, the key was
    released, and the retry wrote a second row."""
    key = str(uuid.uuid4())
    for _ in range(2):
        assert post("/on-default", key, HTTP_X_FAIL="1").status_code == 500
    assert widgets("default") == 0
    assert records("shard") == 0


def test_the_refusal_names_the_view_and_both_databases(records_on_shard: None):
    with pytest.raises(CrossDatabaseWrite) as raised:
        post("/on-default", str(uuid.uuid4()), client=Client())
    message = str(raised.value)
    assert "tests.store.test_routing.on_default" in message and "POST /on-default" in message
    assert "'default'" in message and "'shard'" in message
    assert (raised.value.database, raised.value.record_database) == ("default", "shard")


def test_a_view_that_catches_the_refusal_still_does_not_complete(records_on_shard: None):
    key = str(uuid.uuid4())
    assert post("/swallows", key).status_code == 500
    assert post("/swallows", key).status_code == 500  # not a replay of a false 201
    assert widgets("default") == 0 and records("shard") == 0


def test_reads_elsewhere_pass(records_on_shard: None):
    Widget.objects.using("default").create(name="existing")
    response = post("/reads-default", str(uuid.uuid4()))
    assert response.status_code == 201 and response.json() == {"widgets": 1}


def test_an_unguarded_database_takes_writes_outside_the_guarantee(
    records_on_shard: None, settings: Any
):
    settings.IDEMPOTENCY = {"UNGUARDED_DATABASES": ["default"]}
    key = str(uuid.uuid4())
    assert post("/on-default", key).status_code == 201
    assert post("/on-default", key)["Idempotent-Replayed"] == "true"
    assert widgets("default") == 1


def test_a_phased_view_writes_elsewhere_as_an_effect_of_its_phase(records_on_shard: None):
    key = str(uuid.uuid4())
    assert post("/phased", key).status_code == 201
    assert post("/phased", key)["Idempotent-Replayed"] == "true"
    assert widgets("default") == 1 and records("shard") == 1


def test_the_guard_ends_with_the_view(records_on_shard: None):
    assert post("/reads-default", str(uuid.uuid4())).status_code == 201
    Widget.objects.using("default").create(name="after the request")  # not refused
    assert widgets("default") == 1


#: Statements the guard refuses: every kind that writes, however it is spelled.
WRITES = [
    "INSERT INTO t VALUES (1)",
    "  update t set a = 1",
    "/* note */ DELETE FROM t",
    "-- note\nMERGE INTO t USING s ON true WHEN MATCHED THEN DELETE",
    "(INSERT INTO t VALUES (1))",
    "WITH moved AS (DELETE FROM t RETURNING *) SELECT * FROM moved",
    "WITH a AS (SELECT 1), b AS NOT MATERIALIZED (UPDATE t SET a = 1 RETURNING a) SELECT * FROM b",
    "WITH RECURSIVE a(x) AS (SELECT 1) SEARCH DEPTH FIRST BY x SET o, "
    "b AS ((INSERT INTO t VALUES (1) RETURNING *)) SELECT 1",
    "WITH a AS (WITH b AS (DELETE FROM t RETURNING *) SELECT * FROM b) SELECT * FROM a",
    "WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a",
    "WITH merge AS (SELECT 1) MERGE INTO t USING merge ON true WHEN MATCHED THEN DELETE",
    "CREATE TABLE t (a int)",
    "TRUNCATE t",
    "DROP TABLE t",
    "ALTER TABLE t ADD b int",
    "REPLACE INTO t VALUES (1)",
    "COPY t FROM STDIN",
    "COPY (SELECT 1) TO STDOUT",
    "DO $$ BEGIN INSERT INTO t VALUES (1); END $$",
    "CALL refill()",
    "EXECUTE prepared_insert",
    "PREPARE p AS INSERT INTO t VALUES (1)",
    "NOTIFY widgets_changed",
    "SELECT 1 AS n INTO TEMP TABLE copied",
    "SELECT * INTO new_t FROM t",
    "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
    "EXPLAIN ANALYSE VERBOSE DELETE FROM t",
    "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE t SET a = 1",
    "EXPLAIN (ANALYZE true) WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
    "EXPLAIN (ANALYZE 1) EXECUTE prepared_insert",
    "SELECT 1; INSERT INTO t VALUES (1)",
    "SELECT replace(a, 'x', 'y') FROM t; delete from t",
    "/* outer /* inner */ still a comment */ INSERT INTO t VALUES (1)",
    "/* nested /* as PostgreSQL reads it */ SELECT 1 */ DELETE FROM t",
    "/* ended at the first */ DELETE FROM t /* as SQLite reads it */",
    "GRANT SELECT ON t TO someone",
    "VACUUM t",
    "REFRESH MATERIALIZED VIEW v",
    "COMMENT ON TABLE t IS 'x'",
    "BEGIN INSERT INTO t VALUES (1); END;",
    "DECLARE n NUMBER; BEGIN DELETE FROM t; END;",
]

#: Statements the guard lets through: reads, whatever words they use.
READS_LIST = [
    "SELECT 1",
    "SELECT * FROM t FOR UPDATE",
    "SELECT * FROM t FOR NO KEY UPDATE OF t SKIP LOCKED",
    "SAVEPOINT s1",
    "RELEASE SAVEPOINT s1",
    "RELEASE s1",
    "ROLLBACK TO SAVEPOINT s1",
    "BEGIN",
    "SET LOCAL lock_timeout = '1s'",
    "WITH x AS (SELECT 1) SELECT * FROM x",
    "SELECT updated_at FROM t",
    "SELECT replace (name, 'a', 'b') FROM t",
    "SELECT count(*) AS merge FROM t",
    "SELECT t.delete, t.insert FROM t",
    "SELECT a AS update, b AS truncate FROM t",
    'SELECT "insert", "merge" FROM "update"',
    "SELECT * FROM t WHERE name = 'insert into t' OR name = 'delete'",
    "SELECT $x$ DELETE FROM t $x$",
    "-- delete from t\nSELECT 1",
    "WITH merge AS (SELECT replace(a, 'b', 'c') FROM t) SELECT * FROM merge",
    "WITH RECURSIVE n(i) AS NOT MATERIALIZED (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
    "CYCLE i SET is_cycle USING path SELECT count(*) AS delete FROM n",
    "WITH ids AS (SELECT id FROM t) SELECT t.id FROM t JOIN ids USING (id) FOR UPDATE OF t",
    "(SELECT 1) UNION (SELECT 2)",
    "VALUES (1), (2)",
    "TABLE t",
    "EXPLAIN INSERT INTO t VALUES (1)",
    "EXPLAIN (ANALYZE false) DELETE FROM t",
    "EXPLAIN (ANALYZE off, COSTS off) UPDATE t SET a = 1",
    "EXPLAIN (ANALYZE 0) MERGE INTO t USING s ON true WHEN MATCHED THEN DELETE",
    "EXPLAIN ANALYZE SELECT replace(a, 'b', 'c') FROM t",
    "PREPARE p AS SELECT replace(a, 'b', 'c') FROM t",
    "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM t FOR UPDATE",
    "LISTEN widgets_changed",
    "SHOW lock_timeout",
    "LOCK TABLE t IN SHARE MODE",
    "BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY; SELECT replace(a, 'b', 'c') FROM t",
    "BEGIN IMMEDIATE TRANSACTION; SELECT count(*) AS merge FROM t",
]


@pytest.mark.parametrize("sql", WRITES)
def test_statements_that_write(sql: str):
    """Every kind of statement that writes is refused: DML in any case, behind
    comments and parentheses, in a ``WITH`` part or as its main statement, after a
    read in one string, under ``EXPLAIN ANALYZE``; DDL, ``COPY``, ``DO``, ``CALL``,
    ``EXECUTE``, ``NOTIFY``, ``SELECT ... INTO``, a procedural block (``BEGIN ... END``,
    Oracle's anonymous blocks)."""
    assert writes(sql)


@pytest.mark.parametrize("sql", READS_LIST)
def test_statements_that_do_not_write(sql: str):
    """Reads pass whatever keywords they use as functions, aliases, names, literals
    and comments; row locks, ``EXPLAIN`` without ``ANALYZE`` and transaction control
    are reads."""
    assert not writes(sql)


#: Words the guard reads as writing commands (and ``INTO``), used as names in reads.
_WORDS = [
    "insert", "update", "delete", "merge", "replace", "upsert", "truncate", "create",
    "alter", "drop", "rename", "copy", "grant", "revoke", "comment", "call", "do",
    "refresh", "reindex", "cluster", "vacuum", "import", "security", "execute", "notify",
    "load", "reassign",
]  # fmt: skip
_DML = [
    "INSERT INTO t (a) VALUES (1) RETURNING a",
    "UPDATE t SET a = 1 RETURNING a",
    "DELETE FROM t RETURNING a",
    "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE",
]


_EXPLAIN_ANALYZE = [
    "ANALYZE",
    "ANALYZE VERBOSE",
    "(ANALYZE)",
    "(ANALYZE true, FORMAT JSON)",
    "(BUFFERS, ANALYZE)",
]


@st.composite
def _cased(draw: st.DrawFn, text: str) -> str:
    """``text`` with each letter in a case of its own."""
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(text, flips, strict=True))


_space = st.sampled_from([" ", "  ", "\n", "\t", " /* x */ ", " -- x\n"])


@st.composite
def _reads(draw: st.DrawFn) -> str:
    """A read whose functions, aliases, columns, CTE names, literals and comments are
    words of writing commands, in any case."""
    word, other = draw(st.sampled_from(_WORDS)), draw(st.sampled_from([*_WORDS, "into"]))
    word = draw(_cased(word))
    space = draw(_space)
    parts = draw(
        st.lists(
            st.sampled_from(
                [
                    f"{word}(a)",
                    f"count(*) AS {word}",
                    f"t.{word}",
                    f'"{other}"',
                    f"'{other} into t'",
                    f"a{space}AS{space}{word}",
                ]
            ),
            min_size=1,
            max_size=3,
        )
    )
    select = f"SELECT{space}{', '.join(parts)}{space}FROM t"
    shape = draw(st.sampled_from(["plain", "cte", "locked", "commented", "explained"]))
    if shape == "cte":
        return f"WITH {word} AS ({select}) SELECT * FROM {word}"
    if shape == "locked":
        return f"{select} FOR {draw(st.sampled_from(['UPDATE', 'NO KEY UPDATE']))}"
    if shape == "commented":
        return f"/* {other} */ -- {word}\n{select}"
    if shape == "explained":
        return f"EXPLAIN {draw(st.sampled_from(_DML))}"
    return select


@st.composite
def _writes(draw: st.DrawFn) -> str:
    """A statement that writes: DML in any case, spelled in any of its positions."""
    dml = draw(_cased(draw(st.sampled_from(_DML))))
    name = draw(st.sampled_from(_WORDS))
    space = draw(_space)
    shape = draw(st.sampled_from(["plain", "cte", "cte-main", "explain", "after", "paren"]))
    if shape == "cte":
        kind = draw(st.sampled_from(["", "MATERIALIZED ", "NOT MATERIALIZED "]))
        reads = draw(st.integers(0, 2))
        before = "".join(f"r{i}(x) AS (SELECT {name}(x) FROM t), " for i in range(reads))
        return f"WITH {before}{name} AS {kind}({dml}) SELECT * FROM {name}"
    if shape == "cte-main":
        return f"WITH {name} AS (SELECT 1 AS {name}){space}{dml}"
    if shape == "explain":
        options = draw(st.sampled_from(_EXPLAIN_ANALYZE))
        return f"EXPLAIN {options}{space}{dml}"
    if shape == "after":
        return f"SELECT count(*) AS {name} FROM t;{space}{dml}"
    if shape == "paren":
        return f"{space}({dml})"
    return f"/* {name} */{space}{dml}"


@given(_reads())
def test_a_read_is_never_refused_for_the_words_it_uses(sql: str):
    """Property: a read whose names and literals are words of writing commands, in any
    case and spacing, is judged a read."""
    assert not writes(sql)


@given(_writes())
def test_a_write_is_refused_however_it_is_spelled(sql: str):
    """Property: a data-modifying statement is refused in any case and spacing, behind
    comments, in a ``WITH`` part or as its main statement, under ``EXPLAIN ANALYZE``
    and after a read in one string."""
    assert writes(sql)


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_elsewhere_that_uses_write_keywords_as_names_passes(
    records_on_shard: None, name: str
):
    """The view reads ``default`` with SQL whose function, alias or CTE name is a
    write keyword (``replace()``, ``AS merge``): it runs and completes."""
    Widget.objects.using("default").create(name="existing")
    response = post("/reads-sql", str(uuid.uuid4()), HTTP_X_READ=name)
    assert response.status_code == 201, response.content
    assert records("shard") == 1


@pytest.mark.postgres
@pytest.mark.parametrize("name", sorted(PG_READS))
def test_a_postgres_read_elsewhere_with_write_keywords_passes(records_on_shard: None, name: str):
    """PostgreSQL's reads: a locking CTE, ``EXPLAIN`` without ``ANALYZE`` (the statement
    is not run), ``SEARCH``, an alias ``delete``, a dollar-quoted literal."""
    response = post("/reads-sql", str(uuid.uuid4()), HTTP_X_READ=name)
    assert response.status_code == 201, response.content
    assert widgets("default") == 0 and records("shard") == 1


@pytest.mark.postgres
def test_a_notify_elsewhere_is_refused_and_never_delivered(records_on_shard: None):
    """``NOTIFY`` on another database is delivered when that database commits, apart
    from the record: it is refused like a write, and no listener hears it."""
    import psycopg

    settings_dict = connections["default"].settings_dict
    with psycopg.connect(
        dbname=settings_dict["NAME"], user=settings_dict["USER"],
        host=settings_dict["HOST"], port=settings_dict["PORT"], autocommit=True,
    ) as listener:  # fmt: skip
        listener.execute("LISTEN widgets_changed")
        response = post("/notifies", str(uuid.uuid4()))
        assert response.status_code == 500 and records("shard") == 0
        # A notification of the test's own, sent after the request: had the view's
        # gone out, it would arrive first (notifications arrive in commit order).
        listener.execute("NOTIFY widgets_changed, 'marker'")
        heard = next(iter(listener.notifies(timeout=10)))
    assert heard.payload == "marker"


def test_a_plain_callables_block_refuses_writes_elsewhere_too():
    from django_idempotency import inbox

    key = str(uuid.uuid4())
    for _ in range(2):
        with (
            pytest.raises(CrossDatabaseWrite, match="idempotent block task:import"),
            inbox.once(key, principal=PRINCIPAL, endpoint="task:import", using="shard"),
        ):
            Widget.objects.using("default").create(name="elsewhere")
    assert widgets("default") == 0 and records("shard") == 0  # released, nothing kept
    with inbox.once(key, principal=PRINCIPAL, endpoint="task:import", using="shard") as attempt:
        assert not attempt.done
        attempt.result = {"id": Widget.objects.using("shard").create(name="here").pk}
    assert records("shard") == 1 and widgets("shard") == 1


def test_a_block_that_catches_the_refused_write_still_does_not_complete():
    """A ``once()`` block whose write to another database was refused, and which caught
    ``CrossDatabaseWrite`` and carried on, still fails with it when it ends: nothing is
    stored (its result would claim a write that never happened) and the key is
    released, so the next call runs the block again."""
    from django_idempotency import inbox

    key = str(uuid.uuid4())
    with (
        pytest.raises(CrossDatabaseWrite),
        inbox.once(key, principal=PRINCIPAL, endpoint="task:caught", using="shard") as attempt,
    ):
        with contextlib.suppress(CrossDatabaseWrite):
            Widget.objects.using("default").create(name="elsewhere")
        attempt.result = {"imported": True}
    assert widgets("default") == 0 and records("shard") == 0
    with inbox.once(key, principal=PRINCIPAL, endpoint="task:caught", using="shard") as again:
        assert not again.done
        again.result = 1


# --- the sweeper and the relay cover every database ----------------------------------


def test_the_databases_setting_lists_what_sweeper_and_relay_cover(settings: Any):
    assert all_databases() == ("default",)
    settings.IDEMPOTENCY = {"DATABASES": ["default", "shard"]}
    assert all_databases() == ("default", "shard")
    settings.IDEMPOTENCY = {"DATABASES": ["default", "nowhere"]}
    with pytest.raises(ImproperlyConfigured, match="'nowhere'"):
        all_databases()
    assert [m.id for m in check_database_aliases()] == ["django_idempotency.E009"]


def _long_sent_message(alias: str) -> None:
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    OutboxMessage.objects.using(alias).create(
        topic="old",
        payload={},
        dedup_key=uuid.uuid4().hex,
        state=OutboxState.SENT,
        sent_at=past,
        created_at=past,
        available_at=past,
    )


def test_the_sweep_command_sweeps_every_listed_database(settings: Any):
    settings.IDEMPOTENCY = {"DATABASES": ["default", "shard"]}
    for alias in ("default", "shard"):
        _long_sent_message(alias)
    out = StringIO()
    call_command("idempotency_sweep", stdout=out)
    text = out.getvalue()
    assert "database 'default'" in text and "database 'shard'" in text
    assert not OutboxMessage.objects.using("default").exists()
    assert not OutboxMessage.objects.using("shard").exists()


def test_the_sweep_task_sweeps_every_listed_database(settings: Any):
    from django_idempotency import tasks

    settings.IDEMPOTENCY = {"DATABASES": ["default", "shard"]}
    for alias in ("default", "shard"):
        _long_sent_message(alias)
    report = tasks.sweep()
    assert [r["database"] for r in report["databases"]] == ["default", "shard"]
    assert [r["deleted_outbox"] for r in report["databases"]] == [1, 1]


def test_the_relay_command_delivers_from_every_listed_database(settings: Any):
    settings.IDEMPOTENCY = {"DATABASES": ["default", "shard"], "OUTBOX_KICK": False}
    delivered: list[tuple[str, str]] = []

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        delivered.append((message._state.db, message.payload["n"]))

    outbox.register("databases.test")(deliver)
    try:
        for alias in ("default", "shard"):
            with transaction.atomic(using=alias):
                outbox.enqueue("databases.test", {"n": alias}, using=alias)
        call_command("idempotency_relay", "--once", stdout=StringIO())
    finally:
        outbox.unregister("databases.test")
    assert sorted(delivered) == [("default", "default"), ("shard", "shard")]


# --- system checks -------------------------------------------------------------------


def test_no_check_fires_for_a_single_database_project():
    assert check_record_placement() == []
    assert check_database_aliases() == []


def test_a_router_splitting_records_from_the_models_is_reported(records_on_shard: None):
    (warning,) = check_record_placement()
    assert warning.id == "django_idempotency.W007"
    assert "writes idempotency records to 'shard'" in warning.msg
    assert re.search(r"but \d+ model\(s\) to 'default' \(\w+\.\w+", warning.msg)


def test_a_views_database_the_sweeper_does_not_cover_is_reported(settings: Any):
    messages = check_view_databases()
    assert [m.id for m in messages] == ["django_idempotency.W008"]  # on_shard's 'shard'
    assert "tests.store.test_routing.on_shard" in messages[0].msg
    settings.IDEMPOTENCY = {"DATABASES": ["default", "shard"]}
    assert check_view_databases() == []


def test_a_resolver_without_the_databases_setting_is_reported(settings: Any):
    settings.IDEMPOTENCY = {"DATABASE_RESOLVER": "tests.store.test_routing.tenant"}
    assert [m.id for m in check_record_placement()] == ["django_idempotency.W008"]
    settings.IDEMPOTENCY = {
        "DATABASE_RESOLVER": "tests.store.test_routing.tenant",
        "DATABASES": ["default", "shard"],
    }
    assert check_record_placement() == []


def test_the_checks_are_registered():
    ids = {m.id for m in checks.run_checks(tags=["database", "urls"], databases=["default"])}
    assert "django_idempotency.W008" in ids  # this module's on_shard view


def test_using_must_be_an_alias_or_a_callable():
    with pytest.raises(TypeError, match="using takes a database alias or a callable"):
        idempotent(using=3)
