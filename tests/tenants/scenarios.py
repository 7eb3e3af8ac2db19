"""Schema-per-tenant projects (django-tenants): records, claims, sweeps and relays per schema.

Run by tests/integration/test_tenants.py in a pytest of its own, once per layout of the
app (``TENANTS_LAYOUT``: in ``TENANT_APPS`` only, or in ``SHARED_APPS`` too).
tests/tenants/plugin.py makes the database: tenants ``alpha``, ``beta`` and ``gamma``,
each with its own schema holding the app's tables (day-partitioned in ``alpha`` and
``beta``, a plain table in ``gamma``), and the public tenant (``public.test``), whose
schema holds them only in the ``both`` layout. The file name keeps it out of the main
suite's collection, whose settings are not django-tenants'.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django_tenants.utils import schema_context

from django_idempotency import tasks
from django_idempotency.management import audit
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.retention import partitions
from django_idempotency.store import catalog
from django_idempotency.testing import fire_duplicates, travel
from django_idempotency.testing.threads import run_together
from tests.tenants.plugin import BOTH, PARTITIONED, PLAIN, SCHEMAS, TENANTS
from tests.tenants.shop.models import Delivery, Order


def client_of(schema: str) -> Client:
    """A test client whose requests django-tenants routes to ``schema`` (by host)."""
    return Client(HTTP_HOST=f"{schema}.test")


def order(schema: str, key: str, item: str = "book") -> Any:
    return client_of(schema).post(
        "/orders",
        data=json.dumps({"item": item}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def records(schema: str, key: str) -> list[IdempotencyRecord]:
    with schema_context(schema):
        return list(IdempotencyRecord.objects.filter(key=key))


def orders(schema: str) -> int:
    with schema_context(schema):
        return Order.objects.count()


def test_one_key_in_two_tenants_runs_once_in_each() -> None:
    key = str(uuid.uuid4())
    before = {schema: orders(schema) for schema in TENANTS}

    first = {schema: order(schema, key) for schema in TENANTS}
    retried = {schema: order(schema, key) for schema in TENANTS}

    for schema in TENANTS:
        assert first[schema].status_code == 201, first[schema].content
        assert orders(schema) == before[schema] + 1
        assert retried[schema].status_code == 201
        assert retried[schema].content == first[schema].content  # the tenant's own replay
        (record,) = records(schema, key)
        assert record.state == "completed"
        assert json.loads(record.response_body) == json.loads(first[schema].content)


def test_one_key_sent_to_two_tenants_at_once_runs_once_in_each() -> None:
    key = str(uuid.uuid4())
    pair = ("alpha", "gamma")  # a partitioned and a plain record table
    before = {schema: orders(schema) for schema in pair}

    responses = run_together(lambda n: order(pair[n % 2], key), 8)

    # Per tenant: one original, the others replays (201) or in flight (409).
    assert {r.status_code for r in responses} <= {201, 409}, [r.content for r in responses]
    for schema in pair:
        assert orders(schema) == before[schema] + 1
        (record,) = records(schema, key)
        assert record.state == "completed"


def test_cached_table_facts_are_kept_per_schema() -> None:
    catalog.forget()
    # Alternating tenants: each one's claim takes the path of its own table's kind.
    for schema in (*TENANTS, *reversed(TENANTS)):
        assert order(schema, str(uuid.uuid4())).status_code == 201
        connection.set_schema(schema)  # type: ignore[attr-defined]
        assert catalog.is_partitioned(connection) == (schema in PARTITIONED)
        connection.set_schema_to_public()  # type: ignore[attr-defined]
    # Public's own table: partitioned in the both layout; none with TENANT_APPS alone.
    assert catalog.is_partitioned(connection) == BOTH


def test_concurrent_duplicates_inside_one_tenant_run_once() -> None:
    before = {schema: orders(schema) for schema in TENANTS}

    duplicates = fire_duplicates(
        lambda: client_of("alpha"),
        "/orders",
        json.dumps({"item": "lamp"}),
        content_type="application/json",
        count=8,
    )

    duplicates.assert_ran_once()
    assert orders("alpha") == before["alpha"] + 1
    assert orders("beta") == before["beta"]
    assert len(records("alpha", duplicates.key)) == 1
    assert records("beta", duplicates.key) == []


def _days_of(schema: str, key: str) -> dt.date:
    (record,) = records(schema, key)
    assert record.sweep_after is not None
    return record.sweep_after.astimezone(dt.UTC).date()


def _partition_days(schema: str) -> set[dt.date]:
    with schema_context(schema):
        return {p.day for p in partitions.list_partitions(connection)}


@pytest.mark.parametrize("runner", ["command", "celery task"])
def test_one_sweep_drops_a_past_day_in_every_schema(runner: str) -> None:
    tasks.sweep()  # every schema's days ahead, as the sweeper keeps them
    key = str(uuid.uuid4())
    for schema in TENANTS:
        assert order(schema, key).status_code == 201
    day = {schema: _days_of(schema, key) for schema in PARTITIONED}
    for schema in PARTITIONED:
        assert day[schema] in _partition_days(schema)

    with travel(30 * 86400):  # the records' days are a month behind now
        if runner == "command":
            out = io.StringIO()
            call_command("idempotency_sweep", stdout=out)
            text = out.getvalue()
            for schema in PARTITIONED:
                assert f"database 'default', schema '{schema}' (partitions)" in text
            for schema in PLAIN:
                assert f"database 'default', schema '{schema}' (delete)" in text
        else:
            report = tasks.sweep()
            methods = {each["schema"]: each["method"] for each in report["databases"]}
            assert methods == {
                **dict.fromkeys(PARTITIONED, "partitions"),
                **dict.fromkeys(PLAIN, "delete"),
                **({"public": "partitions"} if BOTH else {}),
            }

    for schema in PARTITIONED:
        assert day[schema] not in _partition_days(schema)
    for schema in TENANTS:
        assert records(schema, key) == []


@pytest.mark.parametrize("threads", [1, 3])
def test_one_relay_run_delivers_each_tenants_messages_in_its_schema(
    threads: int, caplog: pytest.LogCaptureFixture
) -> None:
    for schema in TENANTS:
        for n in range(4):
            assert order(schema, str(uuid.uuid4()), item=f"{schema}-{n}").status_code == 201

    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        call_command("idempotency_relay", "--once", "--threads", str(threads), stdout=io.StringIO())

    _assert_delivered_in_place()
    # The handlers' threads and the lease keeper ran in the relay's schema: no mark
    # or delivery failed on the way (a wrong schema has no outbox table).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_relay_task_delivers_each_tenants_messages_in_its_schema() -> None:
    for schema in TENANTS:
        assert order(schema, str(uuid.uuid4())).status_code == 201

    assert tasks.relay_outbox() >= len(TENANTS)

    _assert_delivered_in_place()


def _assert_delivered_in_place() -> None:
    """Every order of each tenant delivered once, to the handler, in that tenant's schema."""
    for schema in TENANTS:
        with schema_context(schema):
            assert not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists()
            delivered = sorted(Delivery.objects.values_list("order", flat=True))
            assert delivered == sorted(Order.objects.values_list("pk", flat=True))


def test_the_recommended_layout_passes_the_system_checks() -> None:
    out = io.StringIO()
    call_command("check", "--fail-level", "WARNING", stdout=out)
    assert "no issues" in out.getvalue()


def test_the_relay_loop_takes_up_a_new_tenant_and_lets_a_dropped_one_go() -> None:
    from django_idempotency.management.commands.idempotency_relay import Command
    from django_idempotency.management.jobs import Outage
    from tests.tenants.customers.models import Client as Tenant

    command = Command()
    relays: dict[Any, Any] = {}
    outages = {"default": Outage("outbox relay", "default", logging.getLogger("tests"))}

    def discover() -> set[str | None]:
        command._discover(relays, ("default",), outages, {}, False, None)
        assert all(each.schema == target[1] for target, each in relays.items())
        return {schema for _alias, schema in relays}

    assert discover() == set(SCHEMAS)
    tenant = Tenant.objects.create(schema_name="delta", name="Delta")
    try:
        assert discover() == {*SCHEMAS, "delta"}
    finally:
        tenant.delete(force_drop=True)
    assert discover() == set(SCHEMAS)


def test_the_audit_finds_keys_minted_per_attempt_in_every_schema() -> None:
    item = f"audit-{uuid.uuid4().hex[:8]}"  # a request no other scenario sends
    fingerprints = {}
    for schema in (*PARTITIONED[:1], *PLAIN[:1]):
        keys = [str(uuid.uuid4()) for _ in range(2)]
        for key in keys:  # one client, one request, a new key per attempt
            assert order(schema, key, item).status_code == 201
        (record,) = records(schema, keys[0])
        fingerprints[schema] = record.fingerprint

    report = audit.keys_minted(3600, limit=1000, send=False)

    ours = [g for g in report.groups if fingerprints.get(g.schema) == g.fingerprint]
    assert {group.schema: group.keys for group in ours} == dict.fromkeys(fingerprints, 2)
    assert report.counts[ours[0].endpoint] >= 2  # counted over both schemas
