"""A duplicate that waits (``wait=``) for an original in flight (docs/protocol.md, "Bounded wait").

Where the owner holds a presence lock, the duplicate queues on it and is woken by the
owner's completion (tests/store/test_presence.py). Where it holds none (a claim behind
a transaction pooler, ``OWNER_PRESENCE = False``, SQLite), nothing can wake the
duplicate: it claims again after pauses that grow from 50 ms to 500 ms.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_idempotency import store
from django_idempotency.protocol.decide import decide
from django_idempotency.protocol.decisions import Respond
from django_idempotency.protocol.digests import Fingerprint
from django_idempotency.protocol.options import Options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

FP = "f" * 64
#: How a claim statement begins: the claim of PostgreSQL, the INSERT of SQLite.
# A claim that meets a held key: one statement on PostgreSQL, a SELECT of the record
# (the ORM store looks before it writes) on SQLite.
CLAIMS = ("SELECT won, id, owner_token", 'SELECT "django_idempotency_record"."id"')


def test_a_duplicate_waiting_on_an_owner_without_presence_pauses_between_claims(settings):
    """The owner's claim holds no presence lock; the duplicate, whose own connection
    could wait on one (a direct PostgreSQL connection), waits 0.6 s and gets 409
    ``request-in-flight`` after a handful of claims, never a busy loop of hundreds. The
    statements are counted, not the time."""
    scope = store.Scope("auth.user:1", "POST /bounded-wait", str(uuid.uuid4()))
    settings.IDEMPOTENCY = {"OWNER_PRESENCE": False}
    owner = store.claim(scope, FP, lease=300, retention=3600)
    assert isinstance(owner, store.Claim) and not owner.present
    settings.IDEMPOTENCY = {}
    try:
        with CaptureQueriesContext(connection) as log:
            decision = decide(scope, Fingerprint(FP), Options(wait=0.6), "default", may_run=True)
        assert isinstance(decision, Respond) and decision.response.status_code == 409
        assert json.loads(decision.response.content)["type"].endswith("request-in-flight")
        # Claims at 0, 0.05, 0.15, 0.35 and 0.6 s (pauses of 50 ms doubling).
        claims = [q for q in log.captured_queries if q["sql"].lstrip().startswith(CLAIMS)]
        assert 3 <= len(claims) <= 8, len(claims)
    finally:
        store.release(owner)
