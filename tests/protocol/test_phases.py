"""Atomic phases and recovery points (docs/phases.md): ``provision`` in
tests/support/testapp/views.py."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_idempotency import derive_key, exceptions, store
from django_idempotency.exceptions import PhaseError
from django_idempotency.models import IdempotencyRecord, OutboxMessage, RecordState
from django_idempotency.protocol.context import IdempotencyContext
from django_idempotency.protocol.options import Options
from django_idempotency.testing import travel
from tests.support.concurrency import Runner, token_client
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget
from tests.support.testapp.views import HYPERVISOR, PHASE_SIZES

ENDPOINT = "POST /provision"


@pytest.fixture(autouse=True)
def _fresh_hypervisor() -> Any:
    HYPERVISOR.reset()
    yield
    HYPERVISOR.reset()


def provision(api: Any, key: str, **headers: str) -> Any:
    api.raise_request_exception = False
    return api.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key, **headers)


def record(key: str) -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(key=key, endpoint=ENDPOINT)


def worker_name(user: Any, key: str) -> str:
    return derive_key(f"auth.user:{user.pk}", ENDPOINT, key, "worker")


def lease_is_over(rec: IdempotencyRecord) -> bool:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s <= statement_timestamp()", [rec.lease_until])
            return bool(cursor.fetchone()[0])
    return rec.lease_until <= timezone.now()


pytestmark = [pytest.mark.django_db, pytest.mark.pooled]


def test_all_phases_then_replay(api, alice, key):
    first = provision(api, key)
    assert first.status_code == 201, first.content
    assert first.json()["size"] == PHASE_SIZES["booted"]
    assert first.json()["vm"] == "vm-1"
    rec = record(key)
    assert rec.state == RecordState.COMPLETED
    assert rec.recovery_point == "booted"
    assert Widget.objects.get().name == worker_name(alice.user, key)
    assert HYPERVISOR.calls == [
        (
            worker_name(alice.user, key),
            derive_key(f"auth.user:{alice.user.pk}", ENDPOINT, key, "boot"),
        )
    ]

    again = provision(api, key)
    assert again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert len(HYPERVISOR.calls) == 1


@pytest.mark.parametrize(
    ("crash", "recovery_point"),
    [("after:allocated", "allocated"), ("after:leased", "leased"), ("in:booted", "leased")],
)
def test_crash_after_a_phase_keeps_the_claim_and_the_retry_resumes(
    api, alice, key, crash, recovery_point
):
    HOOKS["crash"] = crash
    failed = provision(api, key)
    assert failed.status_code == 500

    rec = record(key)
    assert rec.state == RecordState.CLAIMED
    assert rec.recovery_point == recovery_point
    assert lease_is_over(rec), "the lease must end at once so the retry resumes now"
    worker = Widget.objects.get()
    assert worker.size == PHASE_SIZES[recovery_point]
    assert OutboxMessage.objects.count() == 1  # committed with "allocated"

    retry = provision(api, key)
    assert retry.status_code == 201, retry.content
    assert retry.json() == {"id": worker.pk, "size": PHASE_SIZES["booted"], "vm": "vm-1"}
    assert Widget.objects.count() == 1
    assert OutboxMessage.objects.count() == 1  # the finished phase did not run again
    rec.refresh_from_db()
    assert (rec.state, rec.recovery_point) == (RecordState.COMPLETED, "booted")
    # One boot per key: a phase that did not commit may call the hypervisor again,
    # but with the same derived boot id, so it converges on the same VM.
    assert len(HYPERVISOR.boots) == 1
    assert {boot_id for _w, boot_id in HYPERVISOR.calls} == set(HYPERVISOR.boots)
    assert len(HYPERVISOR.calls) == (2 if crash == "in:booted" else 1)


def test_crash_before_any_phase_committed_releases_the_key(api, key):
    HOOKS["crash"] = "in:allocated"
    assert provision(api, key).status_code == 500
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    assert Widget.objects.count() == 0
    assert OutboxMessage.objects.count() == 0

    retry = provision(api, key)
    assert retry.status_code == 201
    assert Widget.objects.count() == 1
    assert record(key).recovery_point == "booted"


def test_release_status_after_a_phase_keeps_the_claim(api, key):
    HOOKS["status_after_leased"] = 503
    busy = provision(api, key)
    assert busy.status_code == 503
    rec = record(key)
    assert (rec.state, rec.recovery_point) == (RecordState.CLAIMED, "leased")
    assert lease_is_over(rec)

    retry = provision(api, key)
    assert retry.status_code == 201
    assert retry.json()["size"] == PHASE_SIZES["booted"]
    assert Widget.objects.count() == 1
    assert len(HYPERVISOR.calls) == 1


def test_a_retry_while_the_resumable_claim_is_live_gets_409(api, key):
    """Only an ended lease is resumed: a live one is still in flight."""
    HOOKS["crash"] = "after:allocated"
    assert provision(api, key).status_code == 500
    IdempotencyRecord.objects.filter(key=key).update(
        lease_until=timezone.now() + dt.timedelta(seconds=60)
    )
    busy = provision(api, key)
    assert busy.status_code == 409
    with travel(120):
        assert provision(api, key).status_code == 201


def test_request_idempotency_reports_the_recovery_point_on_resume(api, key):
    HOOKS["crash"] = "after:leased"
    provision(api, key)
    seen: dict[str, Any] = {}

    def spy(request: Any) -> None:
        idem = request.idempotency
        seen.update(
            taken_over=idem.taken_over,
            recovery_point=idem.recovery_point,
            pending=[p for p in idem.phases if idem.pending(p)],
        )

    HOOKS["during_view"] = spy
    provision(api, key)
    assert seen == {"taken_over": True, "recovery_point": "leased", "pending": ["booted"]}


# The phase API on its own, with a real claim.


def make_context(phases: tuple[str, ...], recovery_point: str = "") -> IdempotencyContext:
    scope = store.Scope("tests:1", "POST /phased", str(uuid.uuid4()))
    claim = store.claim(scope, hashlib.sha256(b"x").hexdigest(), lease=60, retention=3600)
    assert isinstance(claim, store.Claim)
    if recovery_point:
        store.advance(claim, recovery_point)
    context = IdempotencyContext(claim, lease=60, phases=phases)
    context.recovery_point = recovery_point
    return context


def test_phase_commits_its_writes_with_the_recovery_point():
    context = make_context(("one", "two"))
    with context.phase("one"):
        Widget.objects.create(name="one")
    assert context.recovery_point == "one"
    assert IdempotencyRecord.objects.get(pk=context.claim.record_id).recovery_point == "one"
    assert context.done("one") and context.pending("two")


def test_a_failing_phase_rolls_back_and_keeps_the_recovery_point():
    context = make_context(("one", "two"), recovery_point="one")
    with pytest.raises(ZeroDivisionError), context.phase("two"):
        Widget.objects.create(name="two")
        _ = 1 / 0
    assert context.recovery_point == "one"
    assert IdempotencyRecord.objects.get(pk=context.claim.record_id).recovery_point == "one"
    assert not Widget.objects.exists()
    assert context.open_phase == ""


def test_a_phase_whose_claim_was_taken_over_rolls_back():
    context = make_context(("one",))
    IdempotencyRecord.objects.filter(pk=context.claim.record_id).update(owner_token=uuid.uuid4())
    with pytest.raises(exceptions.LeaseLost), context.phase("one"):
        Widget.objects.create(name="lost")
    assert not Widget.objects.exists()
    assert context.recovery_point == ""


@pytest.mark.parametrize(
    ("recovery_point", "name", "message"),
    [
        ("two", "one", "already finished"),
        ("two", "two", "already finished"),
        ("", "three", "is not a phase"),
    ],
)
def test_phase_misuse_is_refused(recovery_point, name, message):
    context = make_context(("one", "two"), recovery_point=recovery_point)
    with pytest.raises(PhaseError, match=message), context.phase(name):
        pytest.fail("the body must not run")


def test_phases_may_be_skipped_forward_but_not_nested():
    context = make_context(("one", "two", "three"))
    with (
        context.phase("two"),
        pytest.raises(PhaseError, match="inside phase 'two'"),
        context.phase("three"),
    ):
        pass
    assert context.done("one") and context.recovery_point == "two"


def test_phase_needs_declared_phases():
    context = make_context(())
    with pytest.raises(PhaseError, match="phases declared"), context.phase("one"):
        pass


def test_unknown_recovery_point_is_reported():
    context = make_context(("one",), recovery_point="renamed")
    with pytest.raises(PhaseError, match="must not be renamed"):
        context.pending("one")


@pytest.mark.parametrize("value", ["allocated", ["a", "a"], ["a", ""], ["x" * 65], [1], True])
def test_phases_option_is_validated(value):
    with pytest.raises(TypeError):
        Options.from_kwargs(phases=value)


def test_phases_option_accepts_a_sequence():
    assert Options.from_kwargs(phases=["a", "b"]).phases == ("a", "b")
    assert Options().merged(Options.from_kwargs(phases=("a",))).phases == ("a",)


# Fencing across processes' worth of requests: real threads on PostgreSQL.


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stalled_original_loses_its_next_phase_to_the_resuming_retry(alice, key, gate):
    """A holds at the gate after "allocated"; its lease runs out; B takes over and
    finishes; when A goes on, its "leased" phase is fenced off and rolled back."""
    name, gate_obj = gate
    runner = Runner()
    runner.start(lambda: provision(token_client(alice.key), key, HTTP_X_GATE=name))
    assert gate_obj.entered.wait(30)
    assert record(key).recovery_point == "allocated"

    with travel(10):  # past A's 5 s lease
        resumed = provision(token_client(alice.key), key)
    assert resumed.status_code == 201, resumed.content
    assert resumed.json()["size"] == PHASE_SIZES["booted"]

    gate_obj.opened.set()
    (original,) = runner.join()
    assert original.status_code == 409
    assert original["Content-Type"] == "application/problem+json"
    assert Widget.objects.get().size == PHASE_SIZES["booted"]
    rec = record(key)
    assert (rec.state, rec.recovery_point) == (RecordState.COMPLETED, "booted")
    assert len(HYPERVISOR.calls) == 1


@pytest.mark.django_db(transaction=True)
def test_phases_commit_on_their_own_under_atomic_requests(monkeypatch, alice, key, settings):
    """The view is exempted from ATOMIC_REQUESTS, so a crash after a phase keeps it."""
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    HOOKS["crash"] = "after:leased"
    assert provision(token_client(alice.key), key).status_code == 500
    assert record(key).recovery_point == "leased"
    assert Widget.objects.get().size == PHASE_SIZES["leased"]
    retry = provision(token_client(alice.key), key)
    assert retry.status_code == 201
    assert Widget.objects.get().size == PHASE_SIZES["booted"]
    assert len(HYPERVISOR.calls) == 1
