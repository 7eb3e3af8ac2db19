"""Adversarial review of owner presence, the write guard and the claim's asynchronous
commit, on PostgreSQL (real threads, separate sessions).

A test whose docstring starts with "FINDING" showed a defect when it was written; the
defects are fixed and the tests guard the fixes, except four documented limits, kept as
strict ``xfail`` tests (they fail while the limit stands). One that starts with "HOLDS"
is an attack that failed, kept because it pins a property the feature promises.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import close_old_connections, connection, connections, transaction
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.test import Client
from django.urls import path

from django_idempotency import exceptions, signals, store
from django_idempotency.exceptions import CrossDatabaseWrite
from django_idempotency.inbox import once
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.protocol.decorators import idempotent
from django_idempotency.store import clock, presence
from django_idempotency.transactions.write_guard import writes
from tests.support.concurrency import Runner
from tests.support.testapp.models import Widget

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
    pytest.mark.urls("tests.test_review_findings"),
]

PRINCIPAL = "reviewer"
FP = "f" * 64
HELD = threading.Event()
OPEN = threading.Event()


def principal(request: Any) -> str:
    return PRINCIPAL


# --- views --------------------------------------------------------------------------


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


RAW_SQL: dict[str, str] = {}


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


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


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


@pytest.fixture(autouse=True)
def _direct_presence() -> None:
    if not presence.takes(connections["default"]):
        pytest.skip("needs a direct PostgreSQL connection (owner presence)")


# --- 1. owner presence --------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/robustness.md, owner presence): "
        "a view that closes its database connection gives up its presence; later phases are fenced"
    ),
)
def test_a_live_phased_owner_that_closes_its_idle_connection_is_taken_over_at_once() -> None:
    """FINDING. A phased owner is alive and working (between two phases, in a long
    downstream call) but has closed its idle database connection, as Django's
    ``close_old_connections()`` does with the default ``CONN_MAX_AGE = 0``. Its session
    ends, so its presence lock goes, and a duplicate takes the claim over at once
    (``by_presence``) with 59 seconds of lease left, and re-runs phase two's
    downstream call while the first one is still making it: the live owner was taken
    over early. The docs promise the owner keeps the lock "for its whole execution,
    across the phases of a phased view"; the lock is tied to a Django connection the
    view is free to close between phases. Expected: the duplicate gets 409 while the
    owner's lease is live."""
    key = str(uuid.uuid4())
    HELD.clear()
    OPEN.clear()
    takeovers: list[bool] = []

    def on_claimed(sender: Any, taken_over: bool, presence: bool = False, **kw: Any) -> None:
        if taken_over:
            takeovers.append(presence)

    signals.claimed.connect(on_claimed)
    runner = Runner()
    runner.start(lambda: post("/phased-long-call", key, HTTP_X_HOLD="1"))
    try:
        assert HELD.wait(30)
        duplicate = post("/phased-long-call", key)
    finally:
        OPEN.set()
        signals.claimed.disconnect(on_claimed)
    runner.join()
    assert takeovers in ([], [True])  # if taken over, then by presence, not by the lease
    assert duplicate.status_code == 409, (
        f"a live owner (lease 60 s, mid-view) was taken over: {duplicate.status_code}, "
        f"phase two ran {Widget.objects.filter(name='two').count()} times"
    )


def test_an_inner_once_block_in_the_owners_session_keeps_the_outer_lock() -> None:
    """HOLDS. Two claims share one database session: a phased view's code runs an
    inbox ``once()`` block (its own claim, presence lock and completion). The inner
    completion releases only the inner key's lock (reentrant session locks are counted
    per key), so the outer owner stays present and a duplicate of the outer request
    gets 409, not a presence takeover."""
    key = str(uuid.uuid4())
    HELD.clear()
    OPEN.clear()
    runner = Runner()
    runner.start(lambda: post("/phased-inner-once", key, HTTP_X_HOLD="1"))
    try:
        assert HELD.wait(30)
        duplicate = post("/phased-inner-once", key)
    finally:
        OPEN.set()
    (first,) = runner.join()
    assert duplicate.status_code == 409
    assert first.status_code == 201
    assert Widget.objects.filter(name="one").count() == 1
    assert advisory_locks_held() == 0


def test_a_waiting_duplicate_never_waits_longer_than_its_wait() -> None:
    """FINDING (fixed). ``presence.wait_for_owner(using, scope, seconds)`` waits twice:
    for the presence lock, then for the row lock of the owner's completion. It once set
    ``lock_timeout`` to ``seconds`` for both, so a duplicate could wait up to twice its
    ``wait=``. Now the second wait gets only what is left: the owner completes while
    the duplicate queues on its presence lock and keeps its transaction open, and the
    ``lock_timeout`` of the row wait is below that of the presence wait. No clock is
    asserted: the two timeouts the waiter set are read from its statements."""
    from django.test.utils import CaptureQueriesContext

    sc = store.Scope(PRINCIPAL, "POST /wait", str(uuid.uuid4()))
    claimed, completion_sent, finish = threading.Event(), threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def owner() -> None:
        try:
            won = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(won, store.Claim) and won.present
            claimed.set()
            _wait_until_a_lock_is_awaited()
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
                completion_sent.set()
                finish.wait(30)  # its transaction stays open past the duplicate's wait
        finally:
            connections.close_all()

    def waiter() -> None:
        try:
            with CaptureQueriesContext(connections["default"]) as queries:
                result["woken"] = presence.wait_for_owner("default", sc, 1.0)
            result["timeouts"] = [
                int(q["sql"].split("'")[-2].removesuffix("ms"))
                for q in queries.captured_queries
                if "lock_timeout" in q["sql"]
            ]
        finally:
            connections.close_all()

    owner_thread = threading.Thread(target=owner, daemon=True)
    owner_thread.start()
    assert claimed.wait(30)
    waiter_thread = threading.Thread(target=waiter, daemon=True)
    waiter_thread.start()
    waiter_thread.join(30)
    finish.set()
    owner_thread.join(30)
    assert completion_sent.is_set()
    assert result["woken"] is False  # the owner's transaction outlived the wait
    first, second = result["timeouts"]
    assert first <= 1000 and second < first, result["timeouts"]


def _wait_until_a_lock_is_awaited() -> None:
    """Block until some session waits for an advisory lock (a bounded poll of pg_locks)."""
    deadline = time.monotonic() + 30
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("no session ever waited for an advisory lock")


def test_a_failure_between_the_claim_and_the_view_leaks_the_presence_lock() -> None:
    """FINDING. A ``claimed`` signal receiver that raises (a metrics exporter whose
    backend is down, an audit hook) fails the request after ``store.claim`` took the
    session-level presence lock but before ``execution.execute`` (whose ``finally``
    calls ``presence.ensure_released``) is entered: nothing releases the lock. On a
    persistent connection the idle session keeps it, so the dead request looks present:
    a retry from another session gets 409 for the whole lease instead of taking over at
    once, and the lock outlives the lease. The docs say "No lock leaks ... every other
    way out of a request ... releases it". Responsible: ``protocol._claim`` sends
    ``signals.claimed`` (and ``glue.run`` opens ``atomic_requests_blocks``) outside any
    ``try`` that releases the claim. Expected: no advisory lock left in the session."""
    key = str(uuid.uuid4())

    def broken_receiver(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the metrics backend is down")

    signals.claimed.connect(broken_receiver)
    try:
        response = post("/plain", key)
    finally:
        signals.claimed.disconnect(broken_receiver)
    assert response.status_code == 500
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    leaked = advisory_locks_held(pid)

    def retry() -> int:
        try:
            return int(post("/plain", key).status_code)
        finally:
            connections.close_all()

    runner = Runner()
    runner.start(retry)
    (status,) = runner.join()
    assert leaked == 0, "the failed request's session still holds the presence lock"
    assert status != 409, "a retry of a dead request waits for the lease"


def test_a_waiter_that_times_out_leaves_no_lock_and_frees_its_place() -> None:
    """HOLDS. A duplicate waiting on a live owner's presence lock gives up after its
    ``seconds`` (``lock_timeout``), returns ``False``, holds no advisory lock afterwards
    (its shared lock is transaction-scoped) and leaves the ``MAX_WAITERS`` count as it
    found it; the owner, still running, is not taken over."""
    sc = store.Scope(PRINCIPAL, "POST /waiter-timeout", str(uuid.uuid4()))
    claimed = threading.Event()
    done = threading.Event()

    def owner() -> None:
        try:
            won = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(won, store.Claim) and won.present
            claimed.set()
            assert done.wait(30)
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()
    try:
        assert claimed.wait(30)
        before = presence.waiters.count
        assert presence.wait_for_owner("default", sc, 0.3) is False
        assert presence.waiters.count == before
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        assert advisory_locks_held(pid) == 0
        found = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(found, store.Existing) and found.response is None  # not taken
    finally:
        done.set()
        thread.join(30)
    assert advisory_locks_held() == 0


def test_after_a_takeover_by_lease_the_new_owner_is_never_taken_over_by_presence() -> None:
    """HOLDS. Owner O (its own session, holding the presence lock) outlives its lease;
    D takes the claim over by lease while O still holds the lock, so D's claim has no
    presence (``owner_pid`` NULL). O then completes: fenced off (``LeaseLost``), its
    statement releases O's lock. A third contender E, from a third session, now finds
    the lock free, but the record names no present owner: it gets the in-flight record
    (the lease decides for D), never a presence takeover of the live D."""
    sc = store.Scope(PRINCIPAL, "POST /lease-takeover", str(uuid.uuid4()))
    claimed, go, finished = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def in_thread(func: Any) -> Any:
        def run() -> None:
            try:
                func()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def owner() -> None:
        won = store.claim(sc, FP, lease=5, retention=3600)
        assert isinstance(won, store.Claim) and won.present
        claimed.set()
        assert go.wait(30)
        try:
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
        except exceptions.LeaseLost:
            outcome["owner"] = "fenced"
        finished.set()

    def third() -> None:
        outcome["third"] = store.claim(sc, FP, lease=30, retention=3600)

    o = in_thread(owner)
    try:
        assert claimed.wait(30)
        clock.set_offset(10)  # O's lease has run out; O is still alive and present
        taken = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(taken, store.Claim) and taken.taken_over
        assert not taken.by_presence and not taken.present
        go.set()
        assert finished.wait(30)
        in_thread(third).join(30)
    finally:
        go.set()
        o.join(30)
        clock.set_offset(0)
    assert outcome["owner"] == "fenced"
    assert isinstance(outcome["third"], store.Existing)
    assert outcome["third"].response is None and outcome["third"].lease_remaining > 0


# --- 2. the write guard -------------------------------------------------------------


def test_a_streaming_bodys_write_to_another_database_is_stored_and_replayed() -> None:
    """FINDING. A single-transaction view whose record is on ``shard`` returns a
    ``StreamingHttpResponse``; its body generator writes a row to ``default``. The body
    is consumed by ``responses.snapshot`` after ``write_guard.guard`` has exited
    (``execution._execute_atomic``), so the write to another database is not refused:
    it commits on its own, the response is completed and replayed. Exactly what the
    guard exists to prevent (an effect outside the record's transaction). Expected:
    the write refused, nothing stored."""
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
def test_an_on_commit_callbacks_write_to_another_database_slips_through() -> None:
    """FINDING (weaker: a design limit worth stating). A view registers
    ``transaction.on_commit(..., using="shard")`` that writes to ``default``. It runs
    after the record's transaction committed, outside the guard: if it fails (or the
    process dies before it), every retry replays a completed response whose effect on
    ``default`` never happened. The guard neither refuses the registration nor the
    write, and docs/deployment.md does not mention callbacks. Expected: refused (or
    documented)."""
    key = str(uuid.uuid4())
    post("/on-commit", key)
    assert widgets("default") == 0, "an on_commit callback wrote to default unguarded"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/deployment.md): threads the view starts have their own connections"
    ),
)
def test_a_write_from_a_thread_the_view_starts_is_not_guarded() -> None:
    """FINDING (weaker: documented only in ``guard()``'s docstring, "this thread's
    connections"). A single-transaction view hands a write to ``default`` to a worker
    thread and waits for it; Django's connections are per thread, so the worker's
    connection has no execute wrapper: the row commits on its own and the response is
    stored. docs/deployment.md says writes to another database "are refused while a
    single-transaction view runs", without the thread limit. Expected: refused, or the
    limit stated in the docs."""
    key = str(uuid.uuid4())
    post("/worker-thread", key)
    assert widgets("default") == 0, "a worker thread's write to default went through"
    assert completed("shard") == 0


RAW_SQL.update(
    {
        "explain-analyze": "EXPLAIN ANALYZE INSERT INTO testapp_widget (name, size) "
        "VALUES ('explained', 0)",
        "select-then-insert": "SELECT 1; INSERT INTO testapp_widget (name, size) "
        "VALUES ('second statement', 0)",
        "select-into": "SELECT 1 AS n INTO TEMP TABLE review_select_into",
        "prepare-execute": "PREPARE review_ins AS INSERT INTO testapp_widget (name, size) "
        "VALUES ('prepared', 0); EXECUTE review_ins",
        "nested-comment": "/* outer /* inner */ still a comment */ INSERT INTO "
        "testapp_widget (name, size) VALUES ('nested', 0)",
    }
)


@pytest.mark.parametrize("name", ["explain-analyze", "prepare-execute", "select-then-insert"])
def test_statements_that_write_but_do_not_start_with_a_write_keyword(name: str) -> None:
    """FINDING. ``write_guard.writes`` reads only the statement's first keyword, so
    statements PostgreSQL executes as writes pass the guard: ``EXPLAIN ANALYZE INSERT``
    (EXPLAIN ANALYZE runs the statement), ``PREPARE ... ; EXECUTE`` (EXECUTE is not
    in the list), and any write placed after a first read in one multi-statement
    string (``SELECT 1; INSERT ...``: psycopg 3's client-side cursor, Django's default,
    sends it as one simple query). The row lands on ``default`` and the response is
    stored on ``shard``. Expected: refused (EXPLAIN ANALYZE and EXECUTE need no
    parsing, only two more leading keywords)."""
    key = str(uuid.uuid4())
    post("/raw", key, HTTP_X_SQL=name)
    assert widgets("default") == 0, f"{RAW_SQL[name]!r} wrote to default unguarded"
    assert completed("shard") == 0


def test_a_write_behind_a_nested_block_comment_is_refused() -> None:
    """HOLDS. PostgreSQL nests ``/* */`` comments; the guard's non-greedy comment
    pattern backtracks to the outer ``*/``, so the INSERT behind it is still seen."""
    key = str(uuid.uuid4())
    post("/raw", key, HTTP_X_SQL="nested-comment")
    assert widgets("default") == 0
    assert completed("shard") == 0


def test_a_composed_psycopg_query_that_writes_is_not_guarded() -> None:
    """FINDING. ``write_guard.writes`` promises to judge "a string, or a composed
    psycopg query", but it takes ``str(sql)``, which for a ``psycopg.sql.Composed`` is
    its repr (``"Composed([SQL('INSERT INTO '), Identifier(...), ...])"``): the first
    word is ``Composed``, so no composed statement is ever judged a write. A view whose
    record is on ``shard`` inserts into ``default`` with ``sql.SQL(...).format(...)``
    and the row lands there; the response is stored. Responsible: ``writes()``'s
    ``text = sql if isinstance(sql, str) else str(sql)``. Fix: render it
    (``sql.as_string(connection)``) before matching."""
    key = str(uuid.uuid4())
    post("/composed", key)
    assert widgets("default") == 0, "a composed INSERT wrote to default unguarded"
    assert completed("shard") == 0


def test_a_bytes_query_that_writes_is_not_judged_a_write() -> None:
    """FINDING (same line as the composed query). psycopg accepts a query as
    ``bytes``; ``str(b"INSERT ...")`` is ``"b'INSERT ..."``, whose first word is ``b``,
    so ``cursor.execute(b"INSERT ...")`` on another database passes the guard."""
    assert writes(b"INSERT INTO testapp_widget (name, size) VALUES ('b', 0)")


def test_select_into_creates_a_table_unguarded() -> None:
    """FINDING. ``SELECT ... INTO`` creates a table (a DDL effect, like the ``CREATE``
    the guard refuses), but starts with SELECT: ``writes()`` says it does not write."""
    assert writes(RAW_SQL["select-into"]), "SELECT ... INTO creates a table"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/deployment.md): "
        "psycopg's cursor.copy() bypasses Django's execute wrappers"
    ),
)
def test_psycopg_copy_through_djangos_cursor_is_not_guarded() -> None:
    """FINDING. ``cursor.copy("COPY ... FROM STDIN")`` on Django's own cursor wrapper
    (``connections["default"].cursor()``, psycopg 3's bulk-load API, reached through
    ``CursorWrapper.__getattr__``) never goes through ``execute_wrapper``, so the guard
    (which lists COPY among the writes) does not see it: the rows land on ``default``
    and the response is stored. Expected: refused."""
    key = str(uuid.uuid4())
    post("/copies", key)
    assert widgets("default") == 0, "COPY via cursor.copy() wrote to default unguarded"
    assert completed("shard") == 0


def test_a_cte_read_with_a_locking_clause_is_refused_as_a_write() -> None:
    """FINDING (false refusal). A read of ``default`` written as a CTE with a locking
    clause (``WITH ids AS (...) SELECT ... FOR UPDATE OF t``) is refused: the ``WITH``
    rule matches any ``UPDATE`` anywhere in the text, here the ``FOR UPDATE``. The same
    read without the CTE passes. Also a CTE comparing against a literal such as
    ``'update'``. Expected: reads are left alone, as the module promises."""
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
    """HOLDS. bulk_create, get_or_create, update_or_create, QuerySet.update and
    .delete, executemany behind leading comments, and a data-modifying CTE, each to
    ``default`` from a view whose record is on ``shard``, are refused before they
    reach the server; the view catches the refusal and answers 201 anyway, and
    nothing is stored (the key is released)."""
    Widget.objects.using("default").create(name="existing")
    before = list(Widget.objects.using("default").values_list("name", "size"))
    response = post("/orm", str(uuid.uuid4()), HTTP_X_WAY=way)
    assert response.status_code == 500  # CrossDatabaseWrite raised again by check()
    assert list(Widget.objects.using("default").values_list("name", "size")) == before
    assert IdempotencyRecord.objects.using("shard").count() == 0


# --- 3. the claim's asynchronous commit ---------------------------------------------


def test_a_claim_in_a_callers_manual_transaction_makes_it_asynchronous(record_table: str) -> None:
    """FINDING. With Django's manual transaction management
    (``transaction.set_autocommit(False)``, or ``"AUTOCOMMIT": False`` in DATABASES)
    the connection is inside the caller's transaction but not in an atomic block. The
    store decides "its own transaction" by ``not connection.in_atomic_block``
    (``store._insert``: ``async_commit=not connection.in_atomic_block``), so the
    claim's ``set_config('synchronous_commit', 'off', true)`` applies to the caller's
    transaction: the caller's own writes, committed later, are committed without
    waiting for the WAL flush. Expected: ``on`` (use ``connection.get_autocommit()``
    as well)."""
    transaction.set_autocommit(False)
    try:
        Widget.objects.create(name="the caller's durable write")
        won = store.claim(
            store.Scope(PRINCIPAL, "POST /manual", str(uuid.uuid4())), FP, lease=30,
            retention=3600,
        )  # fmt: skip
        assert isinstance(won, store.Claim)
        setting = synchronous_commit()
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert setting == "on", "the caller's transaction was made asynchronous by the claim"


def test_a_claim_in_a_callers_manual_transaction_leaks_its_presence_lock(record_table: str) -> None:
    """FINDING. Same manual transaction (``set_autocommit(False)``): ``presence.takes``
    also judges by ``in_atomic_block`` only, so the claim takes the session-level
    presence lock inside the caller's transaction. When the caller rolls back, the
    claim is gone but the session lock is not (session advisory locks ignore
    ROLLBACK), and nothing releases it: on a persistent connection every later claim of
    that scope from another session runs without presence (``owner_pid`` NULL) and a
    waiter of that key queues on a lock nobody will release. Expected: no advisory lock
    left in the session."""
    sc = store.Scope(PRINCIPAL, "POST /manual-leak", str(uuid.uuid4()))
    transaction.set_autocommit(False)
    try:
        won = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(won, store.Claim)
        transaction.rollback()  # the caller's transaction fails: the claim goes with it
    finally:
        transaction.set_autocommit(True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    assert not IdempotencyRecord.objects.filter(key=sc.key).exists()
    assert advisory_locks_held(pid) == 0, "the rolled-back claim's presence lock stayed"


def test_no_synchronous_commit_leak_into_the_session_after_any_claim_outcome(
    record_table: str,
) -> None:
    """HOLDS. After an own-transaction claim that wins, one that finds the record in
    flight, one that replays, and one that takes a dead owner's claim over, the next
    statements of the same connection run with ``synchronous_commit = on``, and a
    caller's ``atomic()`` after them commits synchronously."""
    sc = store.Scope(PRINCIPAL, "POST /leak", str(uuid.uuid4()))
    won = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(won, store.Claim)
    assert synchronous_commit() == "on"

    def duplicate() -> str:
        try:
            found = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(found, store.Existing)
            return synchronous_commit()
        finally:
            connections.close_all()

    runner = Runner()
    runner.start(duplicate)
    assert runner.join() == ["on"]
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], b"{}"))
    replay = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(replay, store.Existing) and replay.response is not None
    assert synchronous_commit() == "on"
    with transaction.atomic():
        Widget.objects.create(name="x")
        assert synchronous_commit() == "on"
