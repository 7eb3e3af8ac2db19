"""Phased views and their records: without its optional key a phased view runs
unprotected; a release never deletes a record whose phase committed."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_idempotency import store
from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_phased_view_with_an_optional_key_runs_unprotected_without_one():
    """``required=False`` on a phased view: without a key every phase runs, unprotected,
    and no record is made; with a key the retry is a replay."""
    client = token_client(TokenFactory(user__username="phaser").key)
    response = client.post("/phased-optional", {}, format="json")
    assert response.status_code == 201, response.content
    assert Widget.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0
    keyed = client.post("/phased-optional", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post("/phased-optional", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert keyed.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 4


@pytest.mark.parametrize("presence", [True, False], ids=["owner-presence", "lease-only"])
def test_release_never_deletes_a_record_whose_phase_committed(settings, presence):
    """``store.release`` of a claim whose phase ``a`` committed (though the caller may not
    have heard it) deletes nothing: the record keeps its recovery point. On PostgreSQL
    with owner presence the release is one statement that also drops the presence lock;
    without it (or on other databases) the fenced ORM delete."""
    settings.IDEMPOTENCY = {"OWNER_PRESENCE": presence}
    scope = store.Scope("auth.user:1", "POST /x", "phase-committed")
    won = store.claim(scope, "f" * 64, lease=30, retention=60)
    with transaction.atomic():
        store.advance(won, "a")  # committed, though the caller may not have heard it
    assert store.release(won) is False
    assert IdempotencyRecord.objects.get().recovery_point == "a"
