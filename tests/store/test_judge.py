"""What a record that holds a key means for a request: the claim's one judgement.

``store.claims.judge`` decides replay, 422, 409, takeover and reuse from the facts the
store reads, for every store kind and entry point; these tests pin its rules and their
order, each against the rule next to it.
"""

from __future__ import annotations

import dataclasses

import pytest

from django_idempotency.models import RecordState
from django_idempotency.store import BY_LEASE, BY_OPERATOR, BY_PRESENCE, Existing, StoredResponse
from django_idempotency.store.claims import Verdict, cause, judge

FP, OTHER = "a" * 64, "b" * 64

CLAIMED = Existing(
    record_id=1,
    state=RecordState.CLAIMED,
    fingerprint=FP,
    lease_remaining=30.0,
    expired=False,
    response=None,
)
COMPLETED = dataclasses.replace(
    CLAIMED,
    state=RecordState.COMPLETED,
    lease_remaining=-5.0,
    response=StoredResponse(201, [], b"{}"),
)


def record(base: Existing, **facts: object) -> Existing:
    return dataclasses.replace(base, **facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("found", "fingerprint", "verdict"),
    [
        (CLAIMED, FP, Verdict.IN_FLIGHT),
        (CLAIMED, OTHER, Verdict.MISMATCH),
        (COMPLETED, FP, Verdict.REPLAY),
        (COMPLETED, OTHER, Verdict.MISMATCH),
        # the lease ran out: the same request takes over, another is refused
        (record(CLAIMED, lease_remaining=-1.0), FP, Verdict.TAKE_OVER),
        (record(CLAIMED, lease_remaining=0.0), FP, Verdict.TAKE_OVER),
        (record(CLAIMED, lease_remaining=-1.0), OTHER, Verdict.MISMATCH),
        # the owner's session is gone while its lease is live: likewise
        (record(CLAIMED, owner_gone=True), FP, Verdict.TAKE_OVER),
        (record(CLAIMED, owner_gone=True), OTHER, Verdict.MISMATCH),
        # past its window: the key is new, whatever the request
        (record(COMPLETED, expired=True), FP, Verdict.REUSE),
        (record(COMPLETED, expired=True), OTHER, Verdict.REUSE),
        (record(CLAIMED, expired=True, lease_remaining=-1.0), OTHER, Verdict.REUSE),
        # ... but never while a claim's lease is live (a heartbeat after the window)
        (record(CLAIMED, expired=True), FP, Verdict.IN_FLIGHT),
        (record(CLAIMED, expired=True), OTHER, Verdict.MISMATCH),
        # a completed record whose lease field is still live is still completed
        (record(COMPLETED, lease_remaining=10.0), FP, Verdict.REPLAY),
        (record(COMPLETED, owner_gone=True), FP, Verdict.REPLAY),
    ],
)
def test_each_record_means_one_thing_for_a_request(found, fingerprint, verdict):
    assert judge(found, fingerprint) is verdict


def test_a_retry_stored_under_other_fingerprint_settings_is_the_same_request():
    # byte for byte the same request, whatever fields each configuration leaves out
    stored = "fp3:" + "A" * 59 + ".raw" + "B" * 28 + ".rawh" + "C" * 27 + ".names123"
    retry = "fp3:" + "Z" * 59 + ".raw" + "B" * 28 + ".rawh" + "C" * 27 + ".names123"
    assert judge(record(COMPLETED, fingerprint=stored), retry) is Verdict.REPLAY
    other = retry.replace("rawh" + "C" * 27, "rawh" + "D" * 27)
    assert judge(record(COMPLETED, fingerprint=stored), other) is Verdict.MISMATCH


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (record(CLAIMED, owner_gone=True), BY_PRESENCE),
        (record(CLAIMED, lease_remaining=-1.0), BY_LEASE),
        (record(CLAIMED, lease_remaining=-1.0, ended_by_operator=True), BY_OPERATOR),
    ],
)
def test_a_takeover_names_its_cause(found, why):
    assert judge(found, FP) is Verdict.TAKE_OVER
    assert cause(found) == why
