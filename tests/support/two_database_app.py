"""Views with one fixed principal, mounted with
``pytest.mark.urls("tests.support.two_database_app")``: views whose records live on
``shard`` and that write to ``default`` in every way a view can (the write guard's
tests), and views on ``default`` that hold mid-flight (owner presence's tests); the
helpers that post to them and read both databases."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections, connections, transaction
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.test import Client
from django.urls import path

from django_idempotency.exceptions import CrossDatabaseWrite
from django_idempotency.inbox import once
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.protocol.decorators import idempotent
from tests.support.testapp.models import Widget

PRINCIPAL = "caller"


FP = "f" * 64


HELD = threading.Event()


OPEN = threading.Event()


def principal(request: Any) -> str:
    return PRINCIPAL


@idempotent(principal=principal, using="shard")
def streams_to_default(request: HttpRequest) -> StreamingHttpResponse:
    """Records on shard; the streamed body writes a row to default as it is produced."""

    def body() -> Iterator[bytes]:
        Widget.objects.using("default").create(name="from-the-stream")
        yield b'{"ok": true}'

    return StreamingHttpResponse(body(), content_type="application/json", status=201)


@idempotent(principal=principal, using="shard")
def on_commit_to_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; after the shard's COMMIT a callback writes to default."""
    Widget.objects.using("shard").create(name="on-shard")
    transaction.on_commit(
        lambda: Widget.objects.using("default").create(name="after-commit"), using="shard"
    )
    return JsonResponse({"ok": True}, status=201)


RAW_SQL: dict[str, str] = {
    "explain-analyze": "EXPLAIN ANALYZE INSERT INTO testapp_widget (name, size) "
    "VALUES ('explained', 0)",
    "select-then-insert": "SELECT 1; INSERT INTO testapp_widget (name, size) "
    "VALUES ('second statement', 0)",
    "select-into": "SELECT 1 AS n INTO TEMP TABLE guard_select_into",
    "prepare-execute": "PREPARE guard_ins AS INSERT INTO testapp_widget (name, size) "
    "VALUES ('prepared', 0); EXECUTE guard_ins",
    "nested-comment": "/* outer /* inner */ still a comment */ INSERT INTO "
    "testapp_widget (name, size) VALUES ('nested', 0)",
}


@idempotent(principal=principal, using="shard")
def raw_to_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; runs the statement named by X-Sql on default."""
    with connections["default"].cursor() as cursor:
        cursor.execute(RAW_SQL[request.headers["X-Sql"]])
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, using="shard")
def copies_to_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; bulk-loads rows into default with psycopg's COPY API, through
    Django's own cursor wrapper (``connections[alias].cursor()``)."""
    with (
        connections["default"].cursor() as cursor,
        cursor.copy("COPY testapp_widget (name, size) FROM STDIN") as copy,
    ):
        copy.write_row(("copied", 0))
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, using="shard")
def cte_read_of_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; only reads default, with a CTE and a locking clause."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "WITH ids AS (SELECT id FROM testapp_widget) "
            "SELECT t.id FROM testapp_widget t JOIN ids USING (id) FOR UPDATE OF t"
        )
        rows = cursor.fetchall()
    return JsonResponse({"n": len(rows)}, status=201)


@idempotent(principal=principal, using="shard")
def orm_writes_to_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; writes to default with the ORM way named by X-Way."""
    way = request.headers["X-Way"]
    qs = Widget.objects.using("default")
    try:
        if way == "bulk_create":
            qs.bulk_create([Widget(name="a"), Widget(name="b")])
        elif way == "get_or_create":
            qs.get_or_create(name="g")
        elif way == "update_or_create":
            qs.update_or_create(name="u", defaults={"size": 2})
        elif way == "update":
            qs.update(size=3)
        elif way == "delete":
            qs.all().delete()
        elif way == "executemany":
            with connections["default"].cursor() as cursor:
                cursor.executemany(
                    "/* leading */ -- comment\n INSERT INTO testapp_widget (name, size) "
                    "VALUES (%s, %s)",
                    [("m", 1), ("n", 2)],
                )
        elif way == "cte":
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "WITH x AS (INSERT INTO testapp_widget (name, size) VALUES ('c', 0) "
                    "RETURNING id) SELECT id FROM x"
                )
    except CrossDatabaseWrite:
        pass  # caught: the request must still not be stored
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, phases=["one", "two"], lease=60)
def phased_long_call(request: HttpRequest) -> JsonResponse:
    """Phase one, then a long downstream call during which the view gives its idle
    database connection back (Django's documented idiom for long-running code), then
    phase two."""
    if request.idempotency.pending("one"):  # type: ignore[attr-defined]
        with request.idempotency.phase("one"):  # type: ignore[attr-defined]
            Widget.objects.create(name="one")
    close_old_connections()  # CONN_MAX_AGE = 0: the idle connection is closed
    if request.headers.get("X-Hold"):
        HELD.set()  # "the downstream call is in progress"
        assert OPEN.wait(30)
    with request.idempotency.phase("two"):  # type: ignore[attr-defined]
        Widget.objects.create(name="two")
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, phases=["one"], lease=60)
def phased_with_inner_once(request: HttpRequest) -> JsonResponse:
    """A phased view whose code, outside any phase, runs an inbox block (its own claim,
    completion and presence lock, in the same database session as the view's)."""
    with once(str(uuid.uuid4()), principal="inner", endpoint="task:inner") as attempt:
        if not attempt.done:
            Widget.objects.create(name="inner")
            attempt.result = {"ok": True}
    if request.headers.get("X-Hold"):
        HELD.set()
        assert OPEN.wait(30)
    with request.idempotency.phase("one"):  # type: ignore[attr-defined]
        Widget.objects.create(name="one")
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, using="shard")
def writes_from_a_worker_thread(request: HttpRequest) -> JsonResponse:
    """Records on shard; hands a write to default to a worker thread and waits for it
    (a thread pool inside the view, as for parallel fan-out)."""

    def work() -> None:
        try:
            Widget.objects.using("default").create(name="from-a-thread")
        finally:
            connections.close_all()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(30)
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal)
def plain(request: HttpRequest) -> JsonResponse:
    """Records on default; writes one row there."""
    Widget.objects.create(name="plain")
    return JsonResponse({"ok": True}, status=201)


@idempotent(principal=principal, using="shard")
def composed_to_default(request: HttpRequest) -> JsonResponse:
    """Records on shard; inserts into default with a psycopg ``sql.Composed`` query
    (psycopg's safe way to put an identifier into a statement)."""
    from psycopg import sql

    query = sql.SQL("INSERT INTO {} (name, size) VALUES (%s, %s)").format(
        sql.Identifier("testapp_widget")
    )
    with connections["default"].cursor() as cursor:
        cursor.execute(query, ["composed", 0])
    return JsonResponse({"ok": True}, status=201)


urlpatterns = [
    path("composed", composed_to_default),
    path("plain", plain),
    path("worker-thread", writes_from_a_worker_thread),
    path("streams", streams_to_default),
    path("on-commit", on_commit_to_default),
    path("raw", raw_to_default),
    path("copies", copies_to_default),
    path("cte-read", cte_read_of_default),
    path("orm", orm_writes_to_default),
    path("phased-long-call", phased_long_call),
    path("phased-inner-once", phased_with_inner_once),
]


def post(url: str, key: str, **headers: Any) -> Any:
    client = Client(raise_request_exception=False)
    return client.post(
        url, {"n": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **headers
    )


def widgets(alias: str) -> int:
    return Widget.objects.using(alias).count()


def completed(alias: str) -> int:
    return IdempotencyRecord.objects.using(alias).filter(state=RecordState.COMPLETED).count()


def advisory_locks_held(pid: int | None = None) -> int:
    """Granted session advisory locks of this test database (of ``pid`` if given)."""
    probe = connections["default"].copy()
    try:
        with probe.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted "
                "AND d.datname = current_database()"
                + (" AND l.pid = %s" if pid is not None else ""),
                [pid] if pid is not None else [],
            )
            return int(cursor.fetchone()[0])
    finally:
        probe.close()
