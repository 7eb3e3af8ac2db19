"""Owner presence (docs/robustness.md#owner-presence): real processes, separate sessions.

A claim made on a direct PostgreSQL connection holds a session-level advisory lock of
its record until its completion or release. These tests prove, with an owner running in
another process (tests/support/presence_owner.py) or thread and its own session:

* an owner killed with SIGKILL is taken over at once, long before its lease ends;
* an owner stopped with SIGSTOP (alive, holding its session) is never taken over;
* behind a transaction pooler, or with ``OWNER_PRESENCE = False``, the lease alone
  decides (the same tests, run by ``make test-pgbouncer``, take that branch);
* no request leaves a presence lock behind, whatever its outcome;
* the automatic heartbeat keeps a claim for three leases with no code in the view;
* a waiting duplicate is woken by the owner's commit, and waiters are capped.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_idempotency import exceptions, metrics, signals, store
from django_idempotency.store import presence
from django_idempotency.store.records import record_store
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.pgbouncer import database_url
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.pooled

pg_only = pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").split(":")[0] not in ("postgres", "postgresql"),
    reason="owner presence is PostgreSQL's",
)
FP = "f" * 64


def _direct() -> bool:
    return presence.takes(connections["default"])


class Owner:
    """A claim held by another process, which the test can stop, continue or kill."""

    def __init__(
        self, scope: store.Scope, *, lease: float, mode: str = "auto", fingerprint: str = FP
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(DATABASE_URL=database_url(), IDEMPOTENCY_OWNER_PRESENCE=mode)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.presence_owner", scope.principal, scope.endpoint,
             scope.key, fingerprint, str(lease)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the owner process did not claim"
        self.info = json.loads(line)

    def send(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        if _direct():  # behind a pooler the server session outlives its client
            _backend_gone(self.info["backend"])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(30)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _backend_gone(pid: int, timeout: float = 30) -> None:
    """Wait until the server has ended the session ``pid`` (it notices the closed socket)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, f"backend {pid} still alive"
            time.sleep(0.01)  # a condition polled, not a synchronisation sleep


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.close()


def _scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /presence", str(uuid.uuid4()))


def _claim(scope: store.Scope, lease: float = 300) -> store.Claim | store.Existing:
    return store.claim(scope, FP, lease=lease, retention=3600)


def _post(token: str, url: str, key: str, body: dict[str, Any] | None = None, **extra: Any) -> Any:
    client = token_client(token)
    return client.post(url, body or {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def _advisory_locks(cursor: Any) -> int:
    cursor.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    )
    return int(cursor.fetchone()[0])


@pg_only
def test_a_killed_owner_is_taken_over_at_once(record_table, owners):
    scope = _scope()
    owner = Owner(scope, lease=300)
    owners.append(owner)
    assert owner.info["present"] is _direct()
    assert isinstance(_claim(scope), store.Existing)  # alive: 409
    sent: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        sent.append(kwargs)

    signals.claimed.connect(receiver)
    sink = metrics.InMemoryMetrics()
    metrics.connect(sink)
    try:
        owner.kill()
        result = _claim(scope)
        if not _direct():  # behind a pooler the owner took no lock: the lease decides
            assert isinstance(result, store.Existing) and result.owner_pid is None
            return
        assert isinstance(result, store.Claim)
        assert result.taken_over and result.by_presence and result.present
        record = store.fetch(scope)
        assert record is not None and record.owner_token == result.owner_token
        assert record.lease_remaining > 290  # a whole new lease, the old one unspent
        protocol_claim = _claim(scope)  # a third contender: the new owner is present
        assert isinstance(protocol_claim, store.Existing)
        store.release(result)
        with connection.cursor() as cursor:
            assert _advisory_locks(cursor) == 0
    finally:
        signals.claimed.disconnect(receiver)
        metrics.disconnect(sink)


def _killed_owner(owners: list[Owner]) -> store.Scope:
    """The scope of a claim whose owner, on a direct connection, was killed mid-lease."""
    if not _direct():
        pytest.skip("behind a pooler no owner takes the lock: the lease decides")
    scope = _scope()
    owner = Owner(scope, lease=300)
    owners.append(owner)
    owner.kill()
    return scope


@pg_only
def test_concurrent_duplicates_of_a_killed_owner_take_it_over_exactly_once(record_table, owners):
    """Eight duplicates find the killed owner gone at once: its claim statement reports
    the fact, and the takeover is fenced by the owner token read, so exactly one takes the claim
    over. The others get in flight: they find the new owner present, or the old
    owner's lock held by the contender testing it at that moment."""
    scope = _killed_owner(owners)
    start, settled = threading.Barrier(8), threading.Barrier(8)

    def contend() -> store.Claim | store.Existing:
        start.wait(30)
        result = _claim(scope)
        settled.wait(30)  # the winner stays present until every duplicate has its answer
        if isinstance(result, store.Claim):
            store.release(result)
        return result

    runner = Runner()
    for _ in range(8):
        runner.start(contend)
    results = runner.join(60)
    won = [result for result in results if isinstance(result, store.Claim)]
    assert len(won) == 1, results
    assert won[0].by_presence and won[0].takeover_cause == store.BY_PRESENCE
    in_flight = [result for result in results if isinstance(result, store.Existing)]
    assert len(in_flight) == 7
    for result in in_flight:
        assert store.judge(result, FP) is store.Verdict.IN_FLIGHT
        assert result.record_id == won[0].record_id


@pg_only
def test_a_duplicate_that_found_the_owner_gone_before_another_took_over_does_not_win(
    record_table, owners, monkeypatch
):
    """Two duplicates find a killed owner gone; one takes the claim over between the
    other's read and its takeover. The takeover is fenced by the owner token read, so
    only the first runs: the other is in flight behind the new, present owner."""
    scope = _killed_owner(owners)
    kind = type(record_store("default"))
    real = kind.take_over
    runner = Runner()
    taken: queue.Queue[store.Claim | store.Existing] = queue.Queue()

    def another() -> store.Claim | store.Existing:
        result = _claim(scope)
        taken.put(result)
        return result  # its connection stays open (present) until the join

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not runner.threads:  # the first contender, between its read and its takeover
            runner.start(another)
            taken.get(timeout=30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kind, "take_over", hooked)
    loser = _claim(scope)
    record = store.fetch(scope)
    (first,) = runner.join(30)
    assert isinstance(first, store.Claim) and first.by_presence, first
    assert isinstance(loser, store.Existing), loser
    assert store.judge(loser, FP) is store.Verdict.IN_FLIGHT
    assert loser.owner_token == first.owner_token
    assert record is not None and record.owner_token == first.owner_token


@pg_only
def test_the_presence_takeover_is_signalled_and_counted_apart(record_table, owners):
    from django_idempotency.protocol.decide import decide as protocol_claim
    from django_idempotency.protocol.digests import Fingerprint
    from django_idempotency.protocol.options import Options

    scope = _scope()
    owner = Owner(scope, lease=300)
    owners.append(owner)
    owner.kill()
    sent: list[dict[str, Any]] = []
    signals.claimed.connect(receiver := lambda sender, **kw: sent.append(kw))
    sink = metrics.InMemoryMetrics()
    metrics.connect(sink)
    try:
        decision = protocol_claim(
            scope, Fingerprint(FP), Options(lease=300), "default", may_run=True
        )
    finally:
        signals.claimed.disconnect(receiver)
        metrics.disconnect(sink)
    if not _direct():
        assert sent == [] and sink.value(metrics.PRESENCE_TAKEOVERS) == 0
        return
    claim = decision.claim  # type: ignore[union-attr]
    assert sent and sent[0]["taken_over"] and sent[0]["presence"]
    assert sent[0]["cause"] == "presence" and claim.takeover_cause == "presence"
    assert sink.value(metrics.PRESENCE_TAKEOVERS, endpoint=scope.endpoint) == 1
    assert sink.value(metrics.TAKEOVERS) == 0  # not an expired lease
    store.release(claim)


@pg_only
def test_a_stopped_owner_is_never_taken_over(record_table, owners):
    scope = _scope()
    owner = Owner(scope, lease=300)
    owners.append(owner)
    owner.process.send_signal(signal.SIGSTOP)  # alive, its session open, not running
    try:
        runner = Runner()
        barrier = threading.Barrier(6)

        def contender() -> Any:
            barrier.wait(10)
            return _claim(scope)

        for _ in range(6):
            runner.start(contender)
        results = runner.join()
        assert all(isinstance(r, store.Existing) and not r.completed for r in results)
        if _direct():
            assert all(r.owner_pid == owner.info["backend"] for r in results)
    finally:
        owner.process.send_signal(signal.SIGCONT)
    assert owner.send("complete") == "completed"  # the stalled owner finishes, fenced
    record = store.fetch(scope)
    assert record is not None and record.completed and record.response is not None


@pg_only
def test_without_presence_a_killed_owner_holds_its_key_for_the_lease(record_table, owners):
    scope = _scope()
    owner = Owner(scope, lease=300, mode="false")
    owners.append(owner)
    assert owner.info["present"] is False
    owner.kill()
    result = _claim(scope)
    assert isinstance(result, store.Existing) and result.owner_pid is None
    assert result.lease_remaining > 250  # the lease decides


@pg_only
@pytest.mark.django_db(transaction=True)  # a claim inside a transaction takes no lock
def test_presence_off_by_setting_and_by_pooler_detection():
    conn = connections["default"]
    conn.ensure_connection()
    with override_settings(IDEMPOTENCY={"OWNER_PRESENCE": False}):
        assert not presence.takes(conn) and not presence.tests(conn)
    with override_settings(IDEMPOTENCY={"OWNER_PRESENCE": True}):
        assert presence.takes(conn) and presence.tests(conn)
    with override_settings(IDEMPOTENCY={"OWNER_PRESENCE": "auto"}):
        assert presence.takes(conn) is presence.direct(conn)
        saved = dict(conn.settings_dict)
        try:
            conn.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True  # a pooler's setting
            assert not presence.takes(conn)
            conn.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = False
            conn.settings_dict["PORT"] = "1"  # a port the server does not listen on
            assert not presence.takes(conn)
        finally:
            conn.settings_dict.clear()
            conn.settings_dict.update(saved)
    with override_settings(IDEMPOTENCY={"OWNER_PRESENCE": "yes"}), pytest.raises(ValueError):
        presence.takes(conn)


@pg_only
@pytest.mark.django_db(transaction=True)
def test_no_request_leaves_a_presence_lock_behind():
    token = TokenFactory(user__username="locks").key
    outcomes = []
    widget = {"name": "a", "size": 1}
    with connection.cursor() as cursor:
        before = _advisory_locks(cursor)
        # completed, replayed, 422, released by status, released by an exception,
        # a phased request suspended after a phase
        key = str(uuid.uuid4())
        outcomes.append(_post(token, "/widgets", key, widget).status_code)
        outcomes.append(_post(token, "/widgets", key, widget).status_code)
        outcomes.append(_post(token, "/widgets", key, {"name": "b", "size": 1}).status_code)
        outcomes.append(_post(token, "/release-503", str(uuid.uuid4())).status_code)
        outcomes.append(_post(token, "/tx/integrity", str(uuid.uuid4())).status_code)
        HOOKS["crash"] = "after:leased"
        outcomes.append(_post(token, "/provision", str(uuid.uuid4()), {"worker": "w1"}).status_code)
        after = _advisory_locks(cursor)
    assert outcomes[:4] == [201, 201, 422, 503] and outcomes[4] >= 500 and outcomes[5] >= 500
    assert before == after == 0


@pg_only
def test_a_lease_lost_completion_releases_the_lock(record_table):
    scope = _scope()
    won = _claim(scope, lease=300)
    assert isinstance(won, store.Claim)
    forged = store.Claim(scope, won.record_id, uuid.uuid4(), False, "", "default",
                         lease=300, present=won.present)  # fmt: skip
    if won.present:
        presence.hold(forged)
    from django.db import transaction

    with pytest.raises(exceptions.LeaseLost), transaction.atomic():
        store.complete(forged, store.StoredResponse(201, [], b"{}"))
    presence.dropped(won)
    with connection.cursor() as cursor:
        assert _advisory_locks(cursor) == 0


@pg_only
@pytest.mark.django_db(transaction=True)
def test_the_automatic_heartbeat_keeps_a_claim_for_three_leases(gate):
    name, gate_obj = gate
    token = TokenFactory(user__username="beater").key
    key = str(uuid.uuid4())
    beats = threading.Semaphore(0)

    def on_beat(sender: str, **kwargs: Any) -> None:
        if kwargs["kept"]:
            beats.release()

    signals.extended.connect(on_beat)
    runner = Runner()
    try:
        runner.start(lambda: _post(token, "/auto-heartbeat", key, HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        for _ in range(9):  # three leases of 0.6 s, a beat every 0.2 s
            assert beats.acquire(timeout=30), "the heartbeat stopped beating"
        duplicate = _post(token, "/auto-heartbeat", key)
        assert duplicate.status_code == 409  # not taken over: the lease is alive
        gate_obj.opened.set()
        (response,) = runner.join()
    finally:
        gate_obj.opened.set()
        signals.extended.disconnect(on_beat)
    assert response.status_code == 201
    assert gate_obj.calls == 1 and Widget.objects.filter(name="auto-heartbeat").count() == 1
    threads = [t for t in threading.enumerate() if t.name.startswith("idempotency-heartbeat")]
    assert threads == []  # stopped when the view returned


@pg_only
@pytest.mark.django_db(transaction=True)
def test_a_waiting_duplicate_is_woken_by_the_commit(gate):
    if not _direct():
        pytest.skip("behind a pooler waiters poll")
    name, gate_obj = gate
    token = TokenFactory(user__username="waiter").key
    key = str(uuid.uuid4())
    woken: list[float] = []
    signals.woken.connect(receiver := lambda sender, **kw: woken.append(kw["waited"]))
    runner = Runner()
    try:
        runner.start(lambda: _post(token, "/waiting", key, HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        runner.start(lambda: _post(token, "/waiting", key))
        deadline = time.monotonic() + 30
        while presence.waiters.count == 0:  # the duplicate queued on the owner's lock
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gate_obj.opened.set()
        first, second = sorted(runner.join(), key=lambda r: r.get("Idempotent-Replayed", ""))
    finally:
        gate_obj.opened.set()
        signals.woken.disconnect(receiver)
    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert len(woken) == 1  # one wake, no polling rounds
    assert Widget.objects.filter(name="waiting").count() == 1


@pg_only
@pytest.mark.django_db(transaction=True)
def test_waiters_past_the_cap_get_an_immediate_409(gate, settings):
    if not _direct():
        pytest.skip("behind a pooler waiters poll")
    settings.IDEMPOTENCY = {"MAX_WAITERS": 1}
    name, gate_obj = gate
    token = TokenFactory(user__username="capped").key
    key = str(uuid.uuid4())
    sink = metrics.InMemoryMetrics()
    metrics.connect(sink)
    runner = Runner()
    try:
        runner.start(lambda: _post(token, "/waiting", key, HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        runner.start(lambda: _post(token, "/waiting", key))
        deadline = time.monotonic() + 30
        while presence.waiters.count == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        capped = _post(token, "/waiting", key)
        assert capped.status_code == 409
        assert sink.value(metrics.WAITERS_FULL) == 1
        gate_obj.opened.set()
        results = runner.join()
    finally:
        gate_obj.opened.set()
        metrics.disconnect(sink)
    assert sorted(r.status_code for r in results) == [201, 201]


@pg_only
@pytest.mark.django_db(transaction=True)
def test_no_plain_callable_leaves_a_presence_lock_behind():
    from django_idempotency import inbox

    key = str(uuid.uuid4())
    direct = _direct()
    with connection.cursor() as cursor:
        with inbox.once(key, principal="locks", endpoint="task:locks") as attempt:
            assert attempt.context is not None
            assert attempt.context.claim.present == direct  # off behind a pooler
            attempt.result = {"ok": True}
        with inbox.once(key, principal="locks", endpoint="task:locks") as again:
            assert again.done
        with pytest.raises(RuntimeError), inbox.once(str(uuid.uuid4()), principal="locks",
                                                     endpoint="task:locks"):  # fmt: skip
            raise RuntimeError("the body failed")
        assert _advisory_locks(cursor) == 0


# --- A connection holds presence locks only for the claims in flight on it ----------


@pytest.fixture
def leaky(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims whose settling never releases their presence lock (a leak on purpose):
    the completing and releasing statements leave the lock alone, and the release a
    failed path makes is skipped. Only the end of the entry point can release it."""
    monkeypatch.setattr(presence, "holds", lambda claim: False)
    monkeypatch.setattr(presence, "ensure_released", lambda claim: None)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _locks_of(pid: int) -> int:
    """Advisory locks the session ``pid`` holds, as another session sees them."""
    from tests.support.faults import admin_connection

    with admin_connection() as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", [pid]
        ).fetchone()
    assert row is not None
    return int(row[0])


def _leftover_lines(caplog: pytest.LogCaptureFixture, what: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "django_idempotency" and f"still held when its {what} ended" in r.message
    ]


@pg_only
@pytest.mark.django_db(transaction=True)
def test_presence_locks_never_pile_up_on_a_persistent_connection(leaky, caplog):
    """Forty requests on one persistent connection (the test client keeps it, as
    ``CONN_MAX_AGE`` does), each of whose claims leaves its presence lock held: when
    each request ends the lock is released and a WARNING says so, so the session holds
    no advisory lock between requests, whatever the outcome (completed, released by
    status, raised, a phased request suspended)."""
    if not _direct():
        pytest.skip("behind a pooler claims take no presence lock")
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    token = TokenFactory(user__username="leaky").key
    pid = _backend_pid()
    statuses = []
    for n in range(10):
        statuses.append(_post(token, "/widgets", str(uuid.uuid4()), {"name": f"w{n}"}).status_code)
        assert _locks_of(pid) == 0
        statuses.append(_post(token, "/release-503", str(uuid.uuid4())).status_code)
        assert _locks_of(pid) == 0
        statuses.append(_post(token, "/tx/integrity", str(uuid.uuid4())).status_code)
        assert _locks_of(pid) == 0
        HOOKS["crash"] = "after:leased"
        statuses.append(_post(token, "/provision", str(uuid.uuid4())).status_code)
        assert _locks_of(pid) == 0
    assert _backend_pid() == pid  # one session all along
    assert statuses[:3] == [201, 503, 500] and statuses[3] >= 500
    lines = _leftover_lines(caplog, "request")
    assert len(lines) == 40 and all(r.levelno == logging.WARNING for r in lines)


@pg_only
@pytest.mark.django_db(transaction=True)
def test_presence_locks_never_pile_up_after_once_blocks_and_tasks(leaky, caplog):
    """The same for ``inbox.once`` blocks (completed, raised, doomed), an
    ``idempotent_call`` function and a Celery ``idempotent_task`` body called in the
    worker's process: each leaves no advisory lock in its session when it ends."""
    if not _direct():
        pytest.skip("behind a pooler claims take no presence lock")
    from django.db import transaction

    from django_idempotency import inbox
    from django_idempotency.inbox.celery import idempotent_task

    caplog.set_level(logging.WARNING, logger="django_idempotency")
    pid = _backend_pid()
    scope = {"principal": "leaky", "endpoint": "task:leaky"}
    with inbox.once(str(uuid.uuid4()), **scope) as attempt:
        attempt.result = {"ok": True}
    assert _locks_of(pid) == 0
    with pytest.raises(RuntimeError), inbox.once(str(uuid.uuid4()), **scope):
        raise RuntimeError("the body failed")
    assert _locks_of(pid) == 0
    with inbox.once(str(uuid.uuid4()), **scope):
        transaction.set_rollback(True)
    assert _locks_of(pid) == 0

    @inbox.idempotent_call(key="event_id", principal="leaky")
    def call(event_id: str) -> int:
        return 1

    @idempotent_task(key="event_id", name="tests.leaky")
    def task(event_id: str) -> int:
        return 2

    assert call("e-1") == 1
    assert _locks_of(pid) == 0
    assert task("e-1") == 2
    assert _locks_of(pid) == 0
    assert len(_leftover_lines(caplog, "once() block")) == 4
    assert len(_leftover_lines(caplog, "task")) == 1


@pg_only
@pytest.mark.django_db(transaction=True)
def test_an_entry_point_leaves_claims_it_did_not_make_alone():
    """A claim made with the store's functions outside any entry point keeps its lock
    while requests and ``once()`` blocks come and go on the same connection: the end of
    an entry point releases only what was claimed in it."""
    if not _direct():
        pytest.skip("behind a pooler claims take no presence lock")
    from django_idempotency import inbox

    pid = _backend_pid()
    held = _claim(_scope())
    assert isinstance(held, store.Claim) and held.present
    token = TokenFactory(user__username="bystander").key
    assert _post(token, "/widgets", str(uuid.uuid4()), {"name": "x"}).status_code == 201
    with inbox.once(str(uuid.uuid4()), principal="p", endpoint="task:bystander") as attempt:
        attempt.result = 1
    assert _locks_of(pid) == 1
    store.release(held)
    assert _locks_of(pid) == 0


@pg_only
@pytest.mark.django_db(transaction=True)
def test_the_presence_of_a_closed_connection_is_forgotten():
    """A claim made with the store's functions outside any entry point, whose
    connection then closed: its session, and the lock, are gone, and the end of the
    next request forgets the claim's presence too, so a long-lived process keeps no
    note of locks no session holds (one per connection lost mid-claim, for ever)."""
    if not _direct():
        pytest.skip("behind a pooler claims take no presence lock")
    held = _claim(_scope())
    assert isinstance(held, store.Claim) and held.present and presence.holds(held)
    connection.close()
    token = TokenFactory(user__username="after-a-close").key
    assert _post(token, "/widgets", str(uuid.uuid4()), {"name": "y"}).status_code == 201
    assert not presence.holds(held)


@pg_only
def test_a_presence_takeover_is_logged_as_one(record_table, owners, caplog):
    """The ``taken_over`` line of a takeover by owner presence says so (``cause`` =
    ``presence``: the earlier owner's database session ended while its lease was live),
    never that a lease expired: none had."""
    from django_idempotency.protocol.decide import decide as protocol_claim
    from django_idempotency.protocol.digests import Fingerprint
    from django_idempotency.protocol.options import Options

    if not _direct():
        pytest.skip("behind a pooler the lease decides")
    caplog.set_level(logging.WARNING, logger="django_idempotency.events")
    scope = _scope()
    owner = Owner(scope, lease=300)
    owners.append(owner)
    owner.kill()
    decision = protocol_claim(scope, Fingerprint(FP), Options(lease=300), "default", may_run=True)
    (line,) = [r for r in caplog.records if getattr(r, "event", "") == "taken_over"]
    assert line.cause == "presence" and line.levelno == logging.WARNING
    assert "database session ended while its lease was live" in line.getMessage()
    assert "expired" not in line.getMessage()
    store.release(decision.claim)  # type: ignore[union-attr]


def _fingerprint_of_post(path: str, body: dict[str, Any]) -> str:
    """The fingerprint of ``POST path`` with JSON ``body``, as a view computes it."""
    from rest_framework.test import APIRequestFactory

    from django_idempotency.protocol import fingerprint
    from django_idempotency.protocol.options import Options

    options = Options()
    return fingerprint.compute(
        APIRequestFactory().post(path, body, format="json"),
        exclude=options.get_fingerprint_exclude(),
        headers=options.get_fingerprint_headers(),
    )


@pg_only
def test_a_presence_takeover_refuses_a_request_with_another_body(record_table, owners):
    """The owner of a key died mid-request while its lease was live. A retry with
    another body under that key is a key reused (422 ``key-reused``), exactly as after
    the lease ran out: presence never lets another request take the claim over; the
    retry of the same request takes it over at once and runs (201)."""
    if not _direct():
        pytest.skip("behind a pooler the lease decides")
    token = TokenFactory(user__username="presence-body")
    key = str(uuid.uuid4())
    scope = store.Scope(f"auth.user:{token.user.pk}", "POST /widgets", key)
    owner = Owner(scope, lease=300, fingerprint=_fingerprint_of_post("/widgets", {"name": "a"}))
    owners.append(owner)
    owner.kill()
    other = _post(token.key, "/widgets", key, {"name": "b"})
    assert other.status_code == 422, other.content
    assert other.json()["type"].endswith("#key-reused")
    same = _post(token.key, "/widgets", key, {"name": "a"})
    assert same.status_code == 201, same.content
    assert list(Widget.objects.values_list("name", flat=True)) == ["a"]


@pg_only
def test_a_presence_takeover_of_a_claim_stored_under_other_settings(record_table, owners):
    """The owner of a key died mid-request; a deploy then left a body field out of the
    fingerprint. The byte-identical retry still takes the claim over at once (the
    claim's statement, or the partitioned table's function, compares by the rule of
    ``store.fingerprints``) and runs; a request with another body is a key reused."""
    if not _direct():
        pytest.skip("behind a pooler the lease decides")
    token = TokenFactory(user__username="presence-settings")
    key = str(uuid.uuid4())
    scope = store.Scope(f"auth.user:{token.user.pk}", "POST /widgets", key)
    first = {"name": "a", "sent_at": 1}
    owner = Owner(scope, lease=300, fingerprint=_fingerprint_of_post("/widgets", first))
    owners.append(owner)
    owner.kill()
    with override_settings(IDEMPOTENCY={"FINGERPRINT_EXCLUDE": ["sent_at"]}):
        other = _post(token.key, "/widgets", key, {"name": "b", "sent_at": 1})
        same = _post(token.key, "/widgets", key, first)
    assert other.status_code == 422, other.content
    assert same.status_code == 201, same.content
    assert list(Widget.objects.values_list("name", flat=True)) == ["a"]
