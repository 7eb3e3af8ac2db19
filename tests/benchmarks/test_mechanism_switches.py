"""Each mechanism switch of ``benchmarks/mechanisms.py`` turns its mechanism off.

``benchmarks/minimal_app/without.py`` turns one speed mechanism off in server B of an
A/B run. A switch that patches a name the package no longer calls turns nothing off,
and the A/B then measures the control twice; so each switch is applied here, in
process (undone by ``monkeypatch``), and the behaviour it removes is checked before
and after, on PostgreSQL.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import store

WITHOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "minimal_app" / "without.py"
FP = "f" * 64
RESPONSE = store.StoredResponse(201, [("Content-Type", "application/json")], b"{}")


def _without() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_without", WITHOUT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def turn_off(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apply the switch ``name`` as B's server does, undone after the test."""
    _without().apply(name, replace=monkeypatch.setattr)


def first_execution() -> store.Claim:
    """A keyed first execution's store calls: the claim, then the completion in a block."""
    won = store.claim(
        store.Scope("switches", "POST /items", str(uuid.uuid4())), FP, lease=30, retention=3600
    )
    assert isinstance(won, store.Claim)
    with transaction.atomic():
        store.complete(won, RESPONSE)
    return won


def catalog_reads(claims: int) -> int:
    """How many catalog reads of the record table's kind ``claims`` first executions send."""
    with CaptureQueriesContext(connection) as queries:
        for _ in range(claims):
            first_execution()
    return sum("relkind" in query["sql"] and "pg_class" in query["sql"] for query in queries)


def test_every_switch_is_named_and_unknown_names_are_refused() -> None:
    """The A/B's names are the switches' names; a name that is none of them is refused."""
    without = _without()
    assert set(without.MECHANISMS) == {
        "cached_table_facts",
        "nothing",
    }
    with pytest.raises(ValueError, match="BENCH_WITHOUT='held_releases'"):
        without.apply("held_releases")


def test_a_switch_whose_target_is_gone_fails_instead_of_patching_nothing() -> None:
    """Patching a name that no longer exists raises: B would otherwise be A again."""
    gone = ModuleType("gone")
    with pytest.raises(AttributeError, match="the mechanism moved"):
        _without()._replace(gone, "pg_params", lambda: None)
    assert not hasattr(gone, "pg_params")


@pytest.mark.postgres
def test_without_cached_table_facts_every_claim_reads_the_catalog(
    record_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As shipped the table's kind is read once per process; switched off, once per claim."""
    first_execution()  # the facts cached, if they were not already
    assert catalog_reads(3) == 0
    turn_off("cached_table_facts", monkeypatch)
    assert catalog_reads(3) == 3


@pytest.mark.postgres
def test_the_control_changes_nothing(record_table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nothing``, the A/B's control: the facts stay cached."""
    first_execution()
    turn_off("nothing", monkeypatch)
    assert catalog_reads(2) == 0
