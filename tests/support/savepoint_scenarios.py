"""One scenario run inside ``transaction.atomic()`` with and without the view's savepoint
wrapper (``django_idempotency.transactions.savepoints``), and end to end through
``/savepoints/scenario`` (tests/support/testapp/views.py::savepoint_scenario)."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_idempotency.transactions import savepoints
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.faults import admin_connection
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

INSERT = "INSERT INTO testapp_widget (name, size) VALUES ('{}', 0)"
#: ``transaction.savepoint_create`` (Django 6.1+, where ``savepoint()`` is deprecated), or
#: ``transaction.savepoint`` before.
new_savepoint = getattr(transaction, "savepoint_create", transaction.savepoint)


@pytest.fixture(autouse=True)
def _no_hooks() -> Any:
    yield
    HOOKS.clear()


@pytest.fixture(autouse=True)
def _wrapper_under_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """SAVEPOINTS_UNDER_TEST=path/to/savepoints.py runs the tests against another
    version of the wrapper (another commit's), to tell which version a failure belongs to."""
    path = os.environ.get("SAVEPOINTS_UNDER_TEST")
    if path:
        spec = importlib.util.spec_from_file_location("savepoints_under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setattr(savepoints, "ViewSavepoints", module.ViewSavepoints)


def committed() -> list[str]:
    """The widgets another session sees."""
    with admin_connection() as admin:
        rows = admin.execute("SELECT name FROM testapp_widget").fetchall()
    return sorted(name for (name,) in rows)


def run(fn: Callable[[], Any], app: bool) -> tuple[str, Any, list[str]]:
    """``fn`` inside one ``transaction.atomic()``, with the app's wrapper or not.

    Returns ("ok", result) or ("raised", exception class name), and what committed
    (then deleted, for the next run).
    """
    try:
        with transaction.atomic():
            if app:
                with savepoints.view_savepoints("default") as wrapper:
                    assert wrapper is not None
                    result = fn()
                    wrapper.drop()
            else:
                result = fn()
        outcome: tuple[str, Any] = ("ok", result)
    except Exception as exc:
        outcome = ("raised", type(exc).__name__)
    rows = committed()
    Widget.objects.all().delete()
    return (*outcome, rows)


def same(fn: Callable[[], Any]) -> tuple[str, Any, list[str]]:
    """Run ``fn`` without and with the wrapper; assert the same outcome."""
    without = run(fn, app=False)
    with_app = run(fn, app=True)
    assert with_app == without
    return without


def post_keyed(scenario: Callable[[], Any]) -> Any:
    HOOKS["scenario"] = scenario
    token = TokenFactory(user__username=f"savepoints-{uuid.uuid4().hex[:8]}")
    return token_client(token.key).post(
        "/savepoints/scenario", {}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())
    )


def post_unkeyed_in_atomic(scenario: Callable[[], Any]) -> Any:
    """The same view without a key, inside one ``transaction.atomic()`` (the baseline)."""

    def inside() -> Any:
        with transaction.atomic():
            return scenario()

    HOOKS["scenario"] = inside
    token = TokenFactory(user__username=f"savepoints-{uuid.uuid4().hex[:8]}")
    return token_client(token.key).post("/savepoints/scenario", {}, format="json")


def recording() -> tuple[list[str], Any]:
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql.split()[0])
        return execute(sql, params, many, context)

    return seen, record
