"""Heartbeats on a server whose default isolation is above READ COMMITTED: refused
with ``HeartbeatUnavailable``, never a 409 ``lease-lost`` for a request nobody took
over (docs/retention.md, "Isolation levels"), on PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_idempotency import exceptions
from django_idempotency.models import IdempotencyRecord
from django_idempotency.store import isolation as store_isolation

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.mark.urls("tests.support.urls")
def test_a_heartbeat_on_a_server_defaulting_to_repeatable_read_is_refused_not_fenced(
    server_repeatable_read: None, api: Any
) -> None:
    """The database server defaults to REPEATABLE READ (``ALTER DATABASE ... SET
    default_transaction_isolation``); Django's OPTIONS say nothing. The first claim
    detects it (the partitioned claim function refuses to run there, the store then
    claims in its own READ COMMITTED transaction). The ``/heartbeat`` view writes a
    row, then calls ``request.idempotency.extend_lease(60)``; nobody else touches the
    key.

    Expected: what the docs promise "above READ COMMITTED" whether set by Django's
    ``OPTIONS["isolation_level"]`` "or a server default such as ALTER DATABASE ... SET
    default_transaction_isolation, detected by the first claim that meets it"
    (docs/retention.md, "Isolation levels"): "Heartbeats are refused ... it raises
    exceptions.HeartbeatUnavailable with an explanation" -- exactly what the same view does
    when the level comes from OPTIONS (tests/store/test_edges.py,
    test_a_heartbeat_is_refused_clearly_at_stricter_levels). In no case may a request
    that nobody took over be answered 409 ``lease-lost`` (docs/retention.md,
    "Fencing": 409 only for a record "taken over while the view ran").

    So ``store.extend`` and ``heartbeat.available`` look at what the claim detected, not
    only at Django's OPTIONS: a heartbeat committed beside the view's REPEATABLE READ
    transaction would make the completion fail to serialize (409 lease-lost on every
    attempt).
    """
    key = str(uuid.uuid4())
    warm = api.post("/widgets", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert warm.status_code == 201, warm.content
    assert "default" in store_isolation.strict_databases  # the claim saw the server's default
    key = str(uuid.uuid4())
    with pytest.raises(exceptions.HeartbeatUnavailable, match="READ COMMITTED"):
        api.post("/heartbeat", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert not IdempotencyRecord.objects.filter(key=key).exists()  # released, not fenced
