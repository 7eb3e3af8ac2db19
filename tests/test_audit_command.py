"""Keys minted per attempt: ``manage.py idempotency_audit``, the Celery task and the
``keys_minted_groups`` gauge (docs/operations.md#keys-minted-per-attempt)."""

from __future__ import annotations

import io
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import override_settings

from django_idempotency import metrics, store, tasks
from django_idempotency.management import audit
from django_idempotency.metrics import InMemoryMetrics
from django_idempotency.testing import travel
from tests.support.clients import client_for

pytestmark = pytest.mark.django_db

WIDGETS = "POST /widgets"


@pytest.fixture
def sink() -> Iterator[InMemoryMetrics]:
    recorded = InMemoryMetrics()
    metrics.connect(recorded)
    yield recorded
    metrics.disconnect(recorded)


def post(api: Any, body: dict[str, Any], key: str | None = None) -> None:
    response = api.post(
        "/widgets", body, format="json", HTTP_IDEMPOTENCY_KEY=key or str(uuid.uuid4())
    )
    assert response.status_code == 201


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("idempotency_audit", *args, stdout=out)
    return out.getvalue()


def gauges(sink: InMemoryMetrics) -> dict[str, float]:
    """The keys_minted_groups gauge per endpoint, as last set."""
    values: dict[str, float] = {}
    for value, labels in sink.observations.get(metrics.KEYS_MINTED.name, []):
        values[labels["endpoint"]] = value
    return values


def test_the_audit_lists_one_principals_identical_requests_under_several_keys(api, bob):
    for _ in range(3):  # a client minting a new key per attempt
        post(api, {"name": "retried"})
    post(api, {"name": "other"})  # another request, its own key
    post(client_for(bob), {"name": "retried"})  # another principal, same body
    out = run("--window", "1h")
    assert "1 group(s) of one principal and one request under several keys" in out
    assert f"  {WIDGETS}: 1 group(s)" in out
    (line,) = [row for row in out.splitlines() if "3 keys" in row]
    assert WIDGETS in line and "3 completed" in line


def test_the_audit_counts_only_claims_within_its_window(api):
    post(api, {"name": "old"})
    post(api, {"name": "old"})
    with travel(2 * 3600):
        assert "0 group(s)" in run("--window", "1h")
        assert "1 group(s)" in run("--window", "3h")


def test_the_audit_lists_at_most_its_limit_and_says_so(api):
    for name in ("a", "b"):
        post(api, {"name": name})
        post(api, {"name": name})
    out = run("--limit", "1")
    assert f"  {WIDGETS}: 2 group(s)" in out
    assert len([row for row in out.splitlines() if "2 keys" in row]) == 1
    assert "Listed the 1 most recent; raise --limit for more." in out


def test_the_audit_sets_the_gauge_and_zeroes_an_endpoint_no_longer_found(sink, api):
    post(api, {"name": "retried"})
    post(api, {"name": "retried"})
    report = audit.keys_minted(3600)
    assert report.total == 1 and gauges(sink) == {WIDGETS: 1.0}
    with travel(2 * 3600):
        audit.keys_minted(3600)
    assert gauges(sink) == {WIDGETS: 0.0}
    (stamp, labels), *_ = sink.observations[metrics.AUDIT_TIME.name]
    assert labels == {} and stamp > 0


def test_the_audit_task_logs_each_endpoint_with_groups(sink, api, caplog):
    post(api, {"name": "retried"})
    post(api, {"name": "retried"})
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        result = tasks.audit_keys_minted(window=3600)
    assert result == {"databases": [{"database": "default", "counts": {WIDGETS: 1}}]}
    (line,) = [r for r in caplog.records if "keys minted per attempt" in r.getMessage()]
    assert line.endpoint == WIDGETS and line.groups == 1
    assert gauges(sink) == {WIDGETS: 1.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--window", "soon"), "is not a duration"),
        (("--window", "0"), "is not a duration"),
        (("--limit", "0"), "--limit must be at least 1"),
        (("--timeout", "0"), "--timeout must be more than 0 seconds"),
    ],
)
def test_bad_options_are_refused_with_a_message(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_a_window_takes_seconds_minutes_hours_or_days(api):
    post(api, {"name": "x"})
    post(api, {"name": "x"})
    for window in ("600", "90m", "6h", "1d"):
        assert "1 group(s)" in run("--window", window)


@pytest.mark.postgres
def test_the_audit_query_is_served_by_the_created_at_index():
    since = audit.clock.store_now(connection)
    sql = audit._SQL.format(table="django_idempotency_record")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, ["completed", since, 10])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "created" in plan and "Seq Scan" not in plan


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_audit_past_its_statement_timeout_is_reported_not_left_running():
    locked, done = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("LOCK TABLE django_idempotency_record IN ACCESS EXCLUSIVE MODE")
                locked.set()
                done.wait(30)
                cursor.execute("ROLLBACK")
        finally:
            connections["default"].close()

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert locked.wait(30)
        with pytest.raises(CommandError, match="statement timeout: audit a shorter window"):
            run("--timeout", "0.2")
    finally:
        done.set()
        holder.join()
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"  # the session's own setting is left as it was


def minted_in(using: str, endpoint: str, times: int = 2) -> None:
    """One principal's one request under ``times`` keys, claimed in database ``using``."""
    for _ in range(times):
        scope = store.Scope("auth.user:7", endpoint, str(uuid.uuid4()))
        assert isinstance(
            store.claim(scope, "f" * 64, lease=30.0, retention=86400.0, using=using), store.Claim
        )


@pytest.mark.django_db(databases=["default", "shard"])
@override_settings(IDEMPOTENCY={"DATABASES": ["default", "shard"]})
def test_the_audit_task_adds_up_every_database_per_endpoint(sink):
    minted_in("default", "POST /jobs")
    minted_in("shard", "POST /jobs")
    minted_in("shard", "POST /runs")
    result = tasks.audit_keys_minted(window=3600)
    assert result == {
        "databases": [
            {"database": "default", "counts": {"POST /jobs": 1}},
            {"database": "shard", "counts": {"POST /jobs": 1, "POST /runs": 1}},
        ]
    }
    assert gauges(sink) == {"POST /jobs": 2.0, "POST /runs": 1.0}


@pytest.mark.django_db(databases=["default", "shard"])
def test_an_audit_task_run_that_missed_a_database_leaves_the_gauges(sink, monkeypatch):
    minted_in("default", "POST /jobs")
    tasks.audit_keys_minted(window=3600, using="default")
    assert gauges(sink) == {"POST /jobs": 1.0}
    stamps = len(sink.observations[metrics.AUDIT_TIME.name])

    def too_slow(*args: Any, **kwargs: Any) -> Any:
        raise audit.AuditTooSlow("the audit ran past its 30 s statement timeout")

    monkeypatch.setattr(audit, "keys_minted", too_slow)
    result = tasks.audit_keys_minted(window=3600, using="default")
    assert result == {
        "databases": [
            {"database": "default", "error": "the audit ran past its 30 s statement timeout"}
        ]
    }
    assert gauges(sink) == {"POST /jobs": 1.0}  # not zeroed by a run that saw nothing
    assert len(sink.observations[metrics.AUDIT_TIME.name]) == stamps  # the audit looks stale
