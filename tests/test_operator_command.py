"""``manage.py idempotency_records``: operators without the admin (docs/operations.md)."""

from __future__ import annotations

import io
import re
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from django_idempotency import store
from django_idempotency.logs import key_hash
from django_idempotency.models import IdempotencyRecord
from django_idempotency.testing import travel
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db
FINGERPRINT = "e" * 64


def records(*args: str) -> str:
    out = io.StringIO()
    call_command("idempotency_records", *args, stdout=out)
    return out.getvalue()


def claim(principal: str = "auth.user:7", key: str | None = None) -> store.Claim:
    scope = store.Scope(principal, "POST /jobs", key or str(uuid.uuid4()))
    won = store.claim(scope, FINGERPRINT, lease=30.0, retention=86400.0)
    assert isinstance(won, store.Claim)
    return won


def test_finds_records_by_key_hash_principal_endpoint_and_key(api, key):
    api.post("/widgets", {"name": "secret-name"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    mine, other = claim(), claim(principal="auth.user:8")
    by_hash = records("--key-hash", key_hash(key))
    assert f"key {key!r} (key_hash {key_hash(key)})" in by_hash
    assert "condition:   completed" in by_hash
    assert "response:    201, application/json, " in by_hash and "bytes" in by_hash
    assert "secret-name" not in by_hash  # never the body unless asked
    assert by_hash.endswith("1 record found.\n")
    by_principal = records("--principal", "auth.user:7")
    assert mine.scope.key in by_principal and other.scope.key not in by_principal
    assert "condition:   in flight" in by_principal
    assert "lease until: " in by_principal and "(lease ends in " in by_principal
    assert records("--endpoint", "POST /jobs").endswith("2 records found.\n")
    assert records("--key", other.scope.key).count("#") == 1


def test_prints_the_body_as_replayed_only_when_asked(api, key):
    first = api.post("/widgets", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    shown = records("--key", key, "--body")
    assert first.content.decode() in shown.splitlines()


def test_conditions_follow_the_store_clock():
    live = claim()
    assert live.scope.key in records("--condition", "in-flight", "--principal", "auth.user:7")
    with travel(45):
        out = records("--principal", "auth.user:7")
        assert "condition:   abandoned" in out and "(lease ended 15 s ago)" in out
        assert "1 record found." in records(
            "--condition", "abandoned", "--principal", "auth.user:7"
        )
        assert "0 records found." in records(
            "--condition", "in-flight", "--principal", "auth.user:7"
        )


def test_end_lease_lets_the_retry_take_over():
    stuck = claim()
    done = records("--key", stuck.scope.key, "--end-lease")
    assert "Ended 1 lease: the next retry with each key takes it over." in done
    assert "lease ended by an operator" in records("--key", stuck.scope.key)
    retry = store.claim(stuck.scope, FINGERPRINT, lease=30.0, retention=86400.0)
    assert isinstance(retry, store.Claim) and retry.taken_over
    assert retry.takeover_cause == store.BY_OPERATOR


def test_forget_response_runs_the_view_again_and_leaves_claims_alone(api, key):
    api.post("/notify", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    record = IdempotencyRecord.objects.get(key=key)
    pending = claim(principal=record.principal)
    out = records("--principal", record.principal, "--forget-response")
    assert "Forgot 1 stored response: the next request with each key runs the view again." in out
    assert "Left alone 1: not completed (a claim's lease can be ended instead)." in out
    assert IdempotencyRecord.objects.filter(pk=pending.record_id).exists()
    again = api.post("/notify", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Widget.objects.filter(name="notify").count() == 2


def test_acting_needs_a_lookup_and_a_key_hash_is_checked():
    claim()
    with pytest.raises(CommandError, match="never act on every record"):
        records("--end-lease")
    with pytest.raises(CommandError, match="never act on every record"):
        records("--condition", "completed", "--forget-response")
    with pytest.raises(CommandError, match="12 hexadecimal digits"):
        records("--key-hash", "not-a-hash")
    with transaction.atomic():
        assert "0 records found." in records("--key-hash", "0" * 12)


def test_finds_records_by_request_path_and_prints_it(api, key):
    widget = Widget.objects.create(name="box")
    api.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    other = claim()
    out = records("--path", f"/widgets/{widget.pk}/reboot")
    assert f"  path:        /widgets/{widget.pk}/reboot" in out
    assert key in out and other.scope.key not in out
    assert out.endswith("1 record found.\n")
    assert "  path:        -" in records("--key", other.scope.key)
    ended = records("--path", f"/widgets/{widget.pk}/reboot", "--end-lease")
    assert "No lease was ended: none of the records found has a live lease." in ended
    assert "Left alone 1: no live lease (completed, or the lease has run out" in ended


def test_end_lease_of_an_ended_lease_says_nothing_was_ended():
    stuck = claim()
    records("--key", stuck.scope.key, "--end-lease")
    again = records("--key", stuck.scope.key, "--end-lease")
    assert "lease ended by an operator" in again
    assert "No lease was ended: none of the records found has a live lease." in again
    assert "Ended 0" not in again


def _printed_keys(out: str) -> set[str]:
    return set(re.findall(r" key '([^']+)' \(key_hash", out))


def test_end_lease_and_forget_act_only_on_the_records_printed_by_limit(api):
    """``--limit N`` prints N records, and ``--end-lease`` / ``--forget-response`` act
    on those N only, never on the other matches."""
    claims = [claim(principal="auth.user:limit") for _ in range(3)]
    out = records("--principal", "auth.user:limit", "--limit", "2", "--end-lease")
    assert "2 records found." in out and "Ended 2 leases" in out
    printed = _printed_keys(out)
    (spared,) = {won.scope.key for won in claims} - printed
    assert "condition:   in flight" in records("--key", spared)
    for key in printed:
        assert "lease ended by an operator" in records("--key", key)

    keys = [str(uuid.uuid4()) for _ in range(3)]
    for key in keys:
        api.post("/widgets", {"name": "limit"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    principal = IdempotencyRecord.objects.get(key=keys[0]).principal
    out = records("--principal", principal, "--limit", "2", "--forget-response")
    assert "Forgot 2 stored responses" in out
    assert set(IdempotencyRecord.objects.filter(key__in=keys).values_list("key", flat=True)) == (
        set(keys) - _printed_keys(out)
    )
