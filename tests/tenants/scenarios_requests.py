"""A request's own work in its tenant's schema: its other connections, its day partition.

Run by tests/integration/test_tenants.py with tests/tenants/scenarios.py (see there).
Every connection the app opens for a request (the heartbeat's, the lease extension's,
the waiters', the test kit's threads) works in the request's schema, never in the
``public`` schema a new django-tenants connection starts in; a claim finds its day
partition, or the default partition, in its own schema; the public site without tables
is refused clearly.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings
from django_tenants.utils import schema_context

from django_idempotency import signals
from django_idempotency.checks.tenants import check_public_urlconf
from django_idempotency.logs import key_hash
from django_idempotency.retention import partitions
from django_idempotency.testing import fence_stale_owner, fire_duplicates, travel
from django_idempotency.testing.threads import run_together
from tests.tenants.plugin import BOTH
from tests.tenants.scenarios import _days_of, _partition_days, client_of, order, orders, records
from tests.tenants.shop.models import Order
from tests.tenants.shop.urls import SLOW


def post(schema: str, path: str, key: str) -> Any:
    return client_of(schema).post(
        path, data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def test_the_heartbeat_keeps_a_tenants_claim_past_its_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = str(uuid.uuid4())
    before = orders("beta")
    beats: list[bool] = []
    enough = threading.Event()

    def on_extended(sender: Any, *, kept: bool, key_hash: str, **_: Any) -> None:
        if key_hash == mine:
            beats.append(kept)
            if len(beats) >= 4 or not kept:  # 1.6 s: past the view's own 1.2 s lease
                enough.set()

    mine = key_hash(key)
    first: list[Any] = []

    def run_first() -> None:
        try:
            first.append(post("beta", "/slow-orders", key))
        finally:
            connections.close_all()

    SLOW.reset()
    signals.extended.connect(on_extended, weak=False)
    thread = threading.Thread(target=run_first, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="django_idempotency"):
            thread.start()
            assert SLOW.started.wait(30), "the view did not start"
            # Four beats: the view has outlived its own lease by now; the last beat
            # has just given it another one, in which the retry comes.
            assert enough.wait(10), f"the heartbeat did not keep the lease: {caplog.text}"
            assert beats == [True] * len(beats), "the heartbeat found its claim taken over"
            retry = post("beta", "/slow-orders", key)
    finally:
        SLOW.release.set()
        thread.join(30)
        signals.extended.disconnect(on_extended)

    assert retry.status_code == 409, retry.content  # in flight: not run a second time
    assert first[0].status_code == 201, first[0].content
    assert orders("beta") == before + 1
    assert not [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]


def test_extend_lease_in_a_tenant_keeps_that_tenants_claim() -> None:
    key = str(uuid.uuid4())
    response = post("alpha", "/extended-orders", key)

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["inside"] is True  # extended from a second connection, beside the view's
    assert body["kept"] is True
    (record,) = records("alpha", key)
    assert record.state == "completed"


def test_duplicates_in_a_tenant_wait_for_the_first_and_get_its_replay() -> None:
    before = orders("gamma")

    duplicates = fire_duplicates(
        lambda: client_of("gamma"), "/waited-orders", "{}", content_type="application/json", count=4
    )

    first = duplicates.assert_ran_once()
    assert [r.status_code for r in duplicates.responses] == [201] * 4  # waited, no 409
    assert {r.content for r in duplicates.responses} == {first.content}
    assert orders("gamma") == before + 1


def test_the_test_kit_works_in_a_tenant() -> None:
    before = orders("beta")

    fencing = fence_stale_owner(
        lambda: client_of("beta"),
        "/orders",
        json.dumps({"item": "kit"}),
        content_type="application/json",
    )

    fencing.assert_fenced()
    assert orders("beta") == before + 1
    with schema_context("beta"):  # the kit's threads run where the test does
        assert run_together(lambda _: Order.objects.count(), 2) == [before + 1] * 2


def _shadow_day_in_public(day: Any) -> str:
    """A table named like ``day``'s partition in public: public's own partition, if any."""
    name = partitions.partition_name(day)
    with schema_context("public"):
        if BOTH:
            partitions.ensure(connection, day)
        else:
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE TABLE IF NOT EXISTS public."{name}" (id int)')
    return name


def test_a_tenants_claim_of_a_day_without_a_partition_stays_in_its_own_schema() -> None:
    """A tenant's claim of a day its schema has no partition for goes to its own
    default partition, never to public's table of that day; creating the day in the
    tenant's schema moves it there."""
    with travel(400 * 86400):  # a day no other scenario claims in
        probe = str(uuid.uuid4())
        assert order("beta", probe).status_code == 201
        day = _days_of("beta", probe)
        assert day not in _partition_days("alpha")
        shadow = _shadow_day_in_public(day)
        try:
            key = str(uuid.uuid4())
            response = order("alpha", key)
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f'DROP TABLE public."{shadow}"')

    assert response.status_code == 201, response.content
    (record,) = records("alpha", key)
    assert record.state == "completed"
    assert _days_of("alpha", key) not in _partition_days("alpha")
    with schema_context("alpha"):
        assert partitions.ensure(connection, day) == 1
    assert _days_of("alpha", key) in _partition_days("alpha")


def test_the_public_site_without_tables_is_refused_as_a_misconfiguration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with override_settings():
        del settings.PUBLIC_SCHEMA_URLCONF  # the public site serves ROOT_URLCONF
        errors = check_public_urlconf()
        if BOTH:  # public has tables of its own: its keyed requests claim there
            assert errors == []
            return
        with caplog.at_level(logging.ERROR, logger="django_idempotency"):
            response = order("public", str(uuid.uuid4()))

    (error,) = errors
    assert error.id == "django_idempotency.E012"
    assert "ROOT_URLCONF" in error.msg and "create_order" in error.msg
    assert response.status_code == 500
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"].endswith("#store-not-set-up")
    assert "Retry-After" not in response
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'public'" in line and "PUBLIC_SCHEMA_URLCONF" in line for line in logged), logged
