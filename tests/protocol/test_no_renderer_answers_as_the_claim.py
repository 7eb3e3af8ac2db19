"""A retry whose ``Accept`` no renderer fits gets what a claim would decide for the same
record (``operators.peek``; docs/protocol.md "A replay ignores the retry's Accept"):
for every way a view is protected, every ``OWNER_PRESENCE``, a record on another
database, expired records, and the owner's presence as the claim tests it
(store/presence.py)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections
from django.urls import path
from django.utils import timezone
from rest_framework.decorators import api_view
from rest_framework.response import Response

from django_idempotency import idempotent, store
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import operators, presence
from django_idempotency.store.sql import presence_key
from tests.protocol.test_replay_negotiation import (
    GONE_PID,
    UNRENDERABLE,
    VIEWS,
    _documented_setup,
    post,
    turn_into_claim,
)
from tests.support import replay_app
from tests.support.testapp.models import Widget


@api_view(["POST"])
@idempotent(using="shard")
def on_shard(request: Any) -> Response:
    """A DRF view whose records (and rows) live on ``shard``."""
    widget = Widget.objects.using("shard").create(name="shard")
    return Response({"id": widget.pk}, status=201)


urlpatterns = [path("shard/receipt", on_shard), *replay_app.urlpatterns]

pytestmark = [pytest.mark.urls("tests.protocol.test_no_renderer_answers_as_the_claim")]

FP, OTHER_FP = "a" * 64, "b" * 64
on_pg = pytest.mark.postgres


# --- helpers ----------------------------------------------------------------------


class Session:
    """Another PostgreSQL session (its own backend), holding locks as an owner would."""

    def __init__(self, using: str = "default") -> None:
        wrapper = connections[using]
        self.raw = wrapper.get_new_connection(wrapper.get_connection_params())
        self.raw.autocommit = True
        self.pid = self._one("SELECT pg_backend_pid()")

    def _one(self, sql: str, params: Any = None) -> Any:
        with self.raw.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()[0]

    def hold(self, scope: dict[str, str]) -> None:
        """The owner's session-level presence lock, as a live owner holds it."""
        assert self._one(f"SELECT pg_try_advisory_lock({presence_key()})", scope)

    def unhold(self, scope: dict[str, str]) -> None:
        assert self._one(f"SELECT pg_advisory_unlock({presence_key()})", scope)

    def probe(self, scope: dict[str, str]) -> None:
        """A transaction-level lock on the key held until this session's transaction
        ends: what a concurrent claim's ``owner_gone`` test leaves inside a caller's
        transaction (or a waiter holds in shared mode)."""
        self.raw.autocommit = False
        assert self._one(f"SELECT pg_try_advisory_xact_lock({presence_key()})", scope)

    def close(self) -> None:
        self.raw.close()


@contextmanager
def session(using: str = "default") -> Iterator[Session]:
    other = Session(using)
    try:
        yield other
    finally:
        other.close()


def scope_of(record: IdempotencyRecord) -> dict[str, str]:
    return {"principal": record.principal, "endpoint": record.endpoint, "key": record.key}


def own_pid(using: str = "default") -> int:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def snapshot(using: str = "default") -> list[tuple[Any, ...]]:
    return list(
        IdempotencyRecord.objects.using(using).values_list(
            "pk", "state", "owner_token", "lease_until", "owner_pid", "expires_at"
        )
    )


def problem_type(response: Any) -> str:
    return str(json.loads(response.content)["type"])


def used_once(api: Any, key: str, way: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """The URL and body of the view protected ``way``, which ``key`` completed once."""
    _documented_setup(way, monkeypatch)
    url, data = VIEWS[way]
    assert post(api, url, key, data).status_code == 201
    return url, data


# --- every way a view is protected ------------------------------------------------


@on_pg
@pytest.mark.django_db
@pytest.mark.parametrize("way", VIEWS)
def test_each_way_no_renderer_after_the_owner_is_gone_is_406_and_the_view_runs_next(
    api, key, way, monkeypatch
):
    url, data = used_once(api, key, way, monkeypatch)
    turn_into_claim(owner_pid=GONE_PID)
    before = snapshot()

    response = post(api, url, key, data, accept=UNRENDERABLE)

    assert response.status_code == 406, response.content
    assert snapshot() == before
    retry = post(api, url, key, data)
    assert retry.status_code == 201, retry.content
    assert Widget.objects.count() == 2  # taken over: the view ran again


@on_pg
@pytest.mark.django_db
@pytest.mark.parametrize("way", VIEWS)
def test_each_way_no_renderer_while_an_owner_in_another_session_runs_is_409(
    api, key, way, monkeypatch
):
    url, data = used_once(api, key, way, monkeypatch)
    with session() as owner:
        record = turn_into_claim(owner_pid=owner.pid)
        owner.hold(scope_of(record))
        response = post(api, url, key, data, accept=UNRENDERABLE)
        runnable = post(api, url, key, data)
    assert response.status_code == 409, response.content
    assert problem_type(response).endswith("request-in-flight")
    assert runnable.status_code == 409  # the claim agrees


@pytest.mark.django_db
@pytest.mark.parametrize("way", VIEWS)
def test_each_way_gone_owner_and_another_body_is_422(api, key, way, monkeypatch):
    url, data = used_once(api, key, way, monkeypatch)
    IdempotencyRecord.objects.update(fingerprint=OTHER_FP)
    turn_into_claim(owner_pid=GONE_PID)
    before = snapshot()
    response = post(api, url, key, data, accept=UNRENDERABLE)
    assert response.status_code == 422, response.content
    assert problem_type(response).endswith("key-reused")
    assert snapshot() == before


@pytest.mark.django_db
@pytest.mark.parametrize("way", VIEWS)
def test_each_way_completed_record_with_a_stale_owner_pid_replays(api, key, way, monkeypatch):
    _documented_setup(way, monkeypatch)
    url, data = VIEWS[way]
    first = post(api, url, key, data, accept="application/json")
    IdempotencyRecord.objects.update(owner_pid=GONE_PID)
    again = post(api, url, key, data, accept=UNRENDERABLE)
    assert again.status_code == 201, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


# --- OWNER_PRESENCE ---------------------------------------------------------------


@on_pg
@pytest.mark.django_db
@pytest.mark.parametrize(("mode", "status"), [(False, 409), (True, 406), ("auto", 406)])
def test_owner_presence_setting_decides_the_gone_owner_no_renderer_answer(
    api, key, settings, mode, status
):
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    turn_into_claim(owner_pid=GONE_PID)
    settings.IDEMPOTENCY = {"OWNER_PRESENCE": mode}
    unrenderable = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    runnable = post(api, "/x/receipt", key, {"name": "r"})
    assert unrenderable.status_code == status, unrenderable.content
    # what the claim decided for the same record: 409 in flight, or a takeover (201)
    assert runnable.status_code == (409 if status == 409 else 201)


# --- expired records --------------------------------------------------------------


@pytest.mark.django_db
def test_expired_completed_record_no_renderer_is_406_and_the_record_is_kept(api, key):
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    past = timezone.now() - dt.timedelta(hours=1)
    IdempotencyRecord.objects.update(expires_at=past, lease_until=past, owner_pid=GONE_PID)
    before = snapshot()
    response = post(api, "/x/receipt", key, {"name": "other"}, accept=UNRENDERABLE)
    assert response.status_code == 406, response.content
    assert snapshot() == before  # peek forgets nothing


@pytest.mark.django_db
def test_expired_claim_with_a_live_lease_and_no_owner_pid_is_in_flight_not_reused(api, key):
    """Past its window but its lease live (a heartbeat after the window), owner
    presence unknown (no pid): in flight, as rule 1 of ``judge`` keeps it."""
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    turn_into_claim(owner_pid=None)
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(hours=1))
    response = post(api, "/x/receipt", key, {"name": "other"}, accept=UNRENDERABLE)
    assert response.status_code == 422
    response = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert response.status_code == 409


@on_pg
@pytest.mark.django_db
def test_expired_claim_with_a_live_lease_and_a_gone_owner_is_406(api, key):
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    turn_into_claim(owner_pid=GONE_PID)
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(hours=1))
    before = snapshot()
    response = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert response.status_code == 406, response.content
    assert snapshot() == before


# --- a record on another database -------------------------------------------------


@on_pg
@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_records_on_another_database_gone_owner_no_renderer_is_406(api, key):
    assert post(api, "/shard/receipt", key).status_code == 201
    turn_into_claim("shard", owner_pid=GONE_PID)
    before = snapshot("shard")
    response = post(api, "/shard/receipt", key, accept=UNRENDERABLE)
    assert response.status_code == 406, response.content
    assert snapshot("shard") == before
    assert post(api, "/shard/receipt", key).status_code == 201


@on_pg
@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
@pytest.mark.parametrize(
    ("lock_on", "status", "runnable_status"),
    [("shard", 409, 409), ("default", 406, 201)],
    ids=["owner present on the record's database", "the pid's lock on another database"],
)
def test_records_on_another_database_presence_is_the_records_databases(
    api, key, lock_on, status, runnable_status
):
    """The owner's session holds the key's lock: on the record's database it is present
    (409 for every retry); a lock in another database says nothing of this record's
    owner, which is gone (the claim's probe on ``shard`` agrees: a takeover)."""
    assert post(api, "/shard/receipt", key).status_code == 201
    with session(lock_on) as holder:
        record = turn_into_claim("shard", owner_pid=holder.pid)
        holder.hold(scope_of(record))
        response = post(api, "/shard/receipt", key, accept=UNRENDERABLE)
        runnable = post(api, "/shard/receipt", key)
        holder.unhold(scope_of(record))
    assert response.status_code == status, response.content
    assert runnable.status_code == runnable_status


# --- peek agrees with the claim, state by state ----------------------------------

LIVE, OVER = 60.0, -60.0


def _setup_state(scope: store.Scope, state: str, other: Session | None) -> None:
    """Make the record of ``scope`` be in ``state`` (claimed/completed, lease, owner)."""
    made = store.claim(scope, FP, lease=30, retention=3600)
    assert isinstance(made, store.Claim)
    presence.ensure_released(made)
    records = IdempotencyRecord.objects.filter(
        principal=scope.principal, endpoint=scope.endpoint, key=scope.key
    )
    now = timezone.now()
    params = {"principal": scope.principal, "endpoint": scope.endpoint, "key": scope.key}
    changes: dict[str, Any] = {"owner_token": uuid.uuid4(), "owner_pid": None}
    lease = OVER if "lease over" in state else LIVE
    changes["lease_until"] = now + dt.timedelta(seconds=lease)
    if "completed" in state:
        changes.update(
            state=RecordState.COMPLETED,
            response_status=201,
            response_body=b"{}",
            lease_until=now - dt.timedelta(seconds=1),
        )
    if "expired" in state:
        changes["expires_at"] = now - dt.timedelta(seconds=1)
    if "gone pid" in state:
        changes["owner_pid"] = GONE_PID
    if "own pid" in state:
        changes["owner_pid"] = own_pid()
    if "other session" in state:
        assert other is not None
        changes["owner_pid"] = other.pid
        other.hold(params)
    if "probed" in state:
        assert other is not None
        other.probe(params)
    records.update(**changes)


#: Record states; "other session"/"probed"/"own pid" need a second session (PostgreSQL).
STATES = [
    "claimed, no pid",
    "claimed, lease over, no pid",
    "claimed, gone pid",
    "claimed, lease over, gone pid",
    "claimed, expired, gone pid",
    "claimed, expired, lease over, gone pid",
    "completed, gone pid",
    "completed, expired, gone pid",
    "claimed, other session",
    "claimed, own pid",
    "claimed, gone pid, probed",
]
PG_STATES = ("other session", "own pid", "probed")


def _peek_says(scope: store.Scope, fp: str) -> str:
    found = store.peek(scope, fp)
    return "own" if found is None else store.judge(found, fp).value


def _claim_says(scope: store.Scope, fp: str) -> str:
    result = store.claim(scope, fp, lease=30, retention=3600)
    if isinstance(result, store.Claim):
        presence.ensure_released(result)
        return "own"
    return store.judge(result, fp).value


def _agreement(state: str, fp: str) -> tuple[str, str]:
    if any(word in state for word in PG_STATES) and connection.vendor != "postgresql":
        pytest.skip("owner presence is PostgreSQL's")
    scope = store.Scope("auth.user:1", "POST /edges", str(uuid.uuid4()))
    other = Session() if connection.vendor == "postgresql" else None
    try:
        _setup_state(scope, state, other)
        peeked = _peek_says(scope, fp)
        claimed = _claim_says(scope, fp)
    finally:
        if other is not None:
            other.close()
    return peeked, claimed


@pytest.mark.parametrize("fp", [FP, OTHER_FP], ids=["same request", "another request"])
@pytest.mark.parametrize("state", STATES)
def test_peek_agrees_with_the_claim_outside_a_transaction(record_table, state, fp):
    peeked, claimed = _agreement(state, fp)
    assert peeked == claimed


@pytest.mark.django_db
@pytest.mark.parametrize("fp", [FP, OTHER_FP], ids=["same request", "another request"])
@pytest.mark.parametrize("state", STATES)
def test_peek_agrees_with_the_claim_inside_a_transaction(state, fp):
    peeked, claimed = _agreement(state, fp)
    assert peeked == claimed


# --- a completion racing the read -----------------------------------------------


@on_pg
@pytest.mark.django_db
def test_an_owner_completing_right_after_the_record_is_read_is_never_answered_406(
    api, key, monkeypatch
):
    """The retry reads the record (claimed, lease live, owner present) and the owner
    completes right after (the completion keeps ``owner_pid`` and releases the lock):
    the answer is one either state allows, 409 before or the replay after, never the
    406 of a claim to take over. The owner's presence is read with the record, in one
    statement."""
    first = post(api, "/x/receipt", key, {"name": "r"})
    assert first.status_code == 201
    completed = IdempotencyRecord.objects.values().get()
    real_fetch = operators.fetch
    with session() as owner:
        record = turn_into_claim(owner_pid=owner.pid)
        owner.hold(scope_of(record))

        def fetch_then_owner_completes(scope: store.Scope, **kwargs: Any) -> Any:
            found = real_fetch(scope, **kwargs)
            IdempotencyRecord.objects.update(  # what django_idempotency_complete writes
                state=RecordState.COMPLETED,
                response_status=completed["response_status"],
                response_body=completed["response_body"],
                response_headers=completed["response_headers"],
                lease_until=timezone.now(),
            )
            owner.unhold(scope_of(record))
            return found

        monkeypatch.setattr(operators, "fetch", fetch_then_owner_completes)
        response = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    assert response.status_code in (201, 409), response.status_code


# --- the owner's presence as the claim tests it ----------------------------------


@on_pg
@pytest.mark.django_db
def test_no_renderer_when_the_recorded_owner_pid_is_this_session_answers_as_the_claim(api, key):
    """The recorded ``owner_pid`` is the retry's own session (a pid reused after the
    owner's session ended, or a claim whose lock was released as a leftover on this
    persistent connection) and no lock is held. The claim never tests its own session
    (``owner_pid <> pg_backend_pid()``): 409. The no-renderer retry must agree."""
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    turn_into_claim(owner_pid=own_pid())
    unrenderable = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
    runnable = post(api, "/x/receipt", key, {"name": "r"})
    assert runnable.status_code == 409
    assert unrenderable.status_code == runnable.status_code, unrenderable.content


@on_pg
@pytest.mark.django_db
def test_no_renderer_while_another_session_tests_the_gone_owners_lock_answers_as_the_claim(
    api, key
):
    """The owner is gone, but another session holds the key's lock at transaction
    level (a concurrent claim's probe inside its caller's transaction, or a waiter):
    the claim's probe cannot take it, so the claim answers 409. So must the retry
    that cannot run the view."""
    assert post(api, "/x/receipt", key, {"name": "r"}).status_code == 201
    with session() as contender:
        record = turn_into_claim(owner_pid=GONE_PID)
        contender.probe(scope_of(record))
        unrenderable = post(api, "/x/receipt", key, {"name": "r"}, accept=UNRENDERABLE)
        runnable = post(api, "/x/receipt", key, {"name": "r"})
    assert runnable.status_code == 409
    assert unrenderable.status_code == runnable.status_code, unrenderable.content
