"""Sweeps and relay passes over tenant schemas: which schemas, what a drop does, what is left.

Run by tests/integration/test_tenants.py with tests/tenants/scenarios.py (see there). A
pass covers the schemas django-tenants knows (a table of the app's name elsewhere is
not a tenant's), skips a tenant deleted while it runs, leaves the connection in the
schema it started in, and takes each schema's own sweeper lock.
"""

from __future__ import annotations

import io
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django_tenants.utils import schema_context

from django_idempotency import retention, tasks
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.store import tenants
from django_idempotency.testing.threads import run_together
from tests.tenants.customers.models import Client as Tenant
from tests.tenants.plugin import BOTH, SCHEMAS, TENANTS
from tests.tenants.scenarios import _assert_delivered_in_place, order
from tests.tenants.shop.models import Delivery, Order

_TABLES = (IdempotencyRecord._meta.db_table, OutboxMessage._meta.db_table)


def _schema_with_tables(name: str) -> None:
    """Schema ``name`` with the app's record and outbox tables (copies of gamma's, plain)."""
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE SCHEMA "{name}"')
        for table in _TABLES:
            cursor.execute(f'CREATE TABLE "{name}"."{table}" (LIKE gamma."{table}" INCLUDING ALL)')


def _light_tenant(name: str) -> Tenant:
    """A tenant whose schema holds only the app's tables (no migrations: fast)."""
    tenant = Tenant(schema_name=name, name=name.title())
    tenant.auto_create_schema = False
    with schema_context("public"):  # django-tenants creates tenants from public only
        tenant.save()
    _schema_with_tables(name)
    return tenant


def _delete_tenant(name: str) -> None:
    with schema_context("public"):
        for tenant in Tenant.objects.filter(schema_name=name):
            tenant.delete(force_drop=True)


@contextmanager
def dropped_while_in(first: str, doomed: str) -> Iterator[list[str]]:
    """Delete tenant ``doomed`` (its schema dropped) once this thread works in ``first``.

    Another connection deletes it, just before this connection's first statement in
    ``first``: a pass that listed ``doomed`` reaches it after its schema went.
    """
    _light_tenant(doomed)
    done: list[str] = []

    def drop(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        if not done and connection.schema_name == first:  # type: ignore[attr-defined]
            done.append(doomed)
            run_together(lambda _: _delete_tenant(doomed), 1)
        return execute(sql, *args)

    try:
        with connection.execute_wrapper(drop):
            yield done
    finally:
        _delete_tenant(doomed)


def _orders_everywhere() -> None:
    for schema in TENANTS:
        assert order(schema, str(uuid.uuid4())).status_code == 201


@pytest.mark.parametrize(
    "runner", ["relay command", "relay task", "sweep command", "sweep task", "audit task"]
)
def test_a_tenant_deleted_during_a_pass_is_skipped_and_the_others_done(
    runner: str, caplog: pytest.LogCaptureFixture
) -> None:
    _orders_everywhere()
    out = io.StringIO()

    with (
        caplog.at_level(logging.INFO, logger="django_idempotency"),
        dropped_while_in("alpha", "delta") as done,
    ):
        if runner == "relay command":
            call_command("idempotency_relay", "--once", stdout=out)
        elif runner == "relay task":
            tasks.relay_outbox()
        elif runner == "sweep command":
            call_command("idempotency_sweep", stdout=out)
        elif runner == "audit task":
            report = tasks.audit_keys_minted()
        else:
            report = tasks.sweep()

    assert done == ["delta"]  # dropped after the pass listed it
    if runner.startswith("relay"):
        _assert_delivered_in_place()  # gamma's, after delta, delivered too
    elif runner == "sweep command":
        for schema in SCHEMAS:
            assert f"schema '{schema}'" in out.getvalue()
    elif runner == "audit task":
        assert [each.get("error") for each in report["databases"]] == [None]  # type: ignore[union-attr]
    else:
        assert {each["schema"] for each in report["databases"]} >= set(SCHEMAS)
    if not BOTH:  # delta's statements found no table (with both lists, public's)
        assert any(
            "'delta'" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records
        )


def test_a_schema_that_is_not_a_tenant_is_neither_swept_nor_relayed() -> None:
    _schema_with_tables("archive")  # a backup of a tenant's tables: no tenant of its own
    try:
        assert tenants.targets(("default",)) == [("default", s) for s in SCHEMAS]
        report = tasks.sweep()
        out = io.StringIO()
        call_command("idempotency_sweep", stdout=out)
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP SCHEMA "archive" CASCADE')

    assert [each["schema"] for each in report["databases"]] == list(SCHEMAS)
    assert "archive" not in out.getvalue()


def test_a_worker_is_back_in_its_tenant_after_sweeps_and_relay_passes() -> None:
    _orders_everywhere()
    marker = str(uuid.uuid4())

    with schema_context("beta"):
        mine = Order.objects.create(item=marker)  # no message: deleted again below
        try:
            for run in (
                tasks.sweep,
                tasks.relay_outbox,
                lambda: call_command("idempotency_sweep", stdout=io.StringIO()),
                lambda: call_command("idempotency_relay", "--once", stdout=io.StringIO()),
            ):
                run()
                # The worker's next task reads beta's tables, not the last schema's.
                assert Order.objects.filter(item=marker).exists()
        finally:
            with schema_context("beta"):
                mine.delete()


def test_sweeps_of_two_tenant_schemas_never_skip_each_other() -> None:
    paused, resume = threading.Event(), threading.Event()
    outbox = OutboxMessage._meta.db_table
    swept: list[retention.SweepReport] = []

    def pause(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        if not paused.is_set() and sql.lstrip().upper().startswith("DELETE") and outbox in sql:
            paused.set()  # alpha's sweep is under way: it holds its sweeper lock
            resume.wait(30)
        return execute(sql, *args)

    def sweep_alpha() -> None:
        try:
            with connection.execute_wrapper(pause):
                swept.append(retention.sweep(schema="alpha"))
        finally:
            paused.set()
            connections.close_all()

    thread = threading.Thread(target=sweep_alpha, daemon=True)
    thread.start()
    try:
        assert paused.wait(30), "the sweep of alpha did not start"
        beta = retention.sweep(schema="beta")
        alpha_again = retention.sweep(schema="alpha")
    finally:
        resume.set()
        thread.join(30)

    assert not beta.skipped  # another schema's sweep does not hold beta's lock
    assert alpha_again.skipped  # alpha's own lock is held by its running sweep
    assert [report.skipped for report in swept] == [False]


def test_a_relay_run_from_a_tenant_delivers_there_with_its_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for n in range(4):
        assert order("beta", str(uuid.uuid4()), item=f"threads-{n}").status_code == 201

    with caplog.at_level(logging.WARNING, logger="django_idempotency"), schema_context("beta"):
        assert relay.deliver_due(threads=3) >= 4  # your own code's relay, in beta

    with schema_context("beta"):
        assert not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists()
        delivered = sorted(Delivery.objects.values_list("order", flat=True))
        assert delivered == sorted(Order.objects.values_list("pk", flat=True))
    # The pool's threads and the lease keeper worked in beta: nothing failed on the way.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
