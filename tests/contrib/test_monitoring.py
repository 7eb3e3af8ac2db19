"""The alert rules and the Grafana dashboard shipped in django_idempotency/monitoring:
every expression names only metrics the app exports, and the files load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.resources import files
from typing import Any

import prometheus_client
import pytest
import yaml

from django_idempotency import metrics
from django_idempotency.contrib import prometheus

pytestmark = pytest.mark.django_db

MONITORING = files("django_idempotency") / "monitoring"
NAME = re.compile(r"\bdjango_idempotency_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads((MONITORING / "dashboard.json").read_text())


def dashboard_expressions() -> list[str]:
    found = [t["expr"] for panel in dashboard()["panels"] for t in panel["targets"]]
    found += [v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v]
    return found


@pytest.fixture
def exported(db: Any) -> set[str]:
    """Every series name the app's registry exposes (counters with ``_total``)."""
    registry = prometheus_client.CollectorRegistry()
    prometheus.install(registry)
    try:
        families = list(registry.collect())
    finally:
        prometheus.uninstall(registry)
    assert any(family.type == "gauge" and "outbox" in family.name for family in families)
    names = set()
    for family in families:
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def test_every_alert_expression_names_only_exported_metrics(exported):
    for rule in rules():
        named = set(NAME.findall(rule["expr"]))
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)


def test_every_dashboard_expression_names_only_exported_metrics(exported):
    for expr in dashboard_expressions():
        named = set(NAME.findall(expr))
        assert named and named <= exported, (expr, named - exported)


def test_each_failure_signature_has_an_alert_and_a_panel():
    signatures = (metrics.KEYS_MINTED, metrics.NEAR_LEASE, metrics.LATE_REPLAYS)
    alerted = " ".join(rule["expr"] for rule in rules())
    charted = " ".join(dashboard_expressions())
    for metric in (*signatures, metrics.AUDIT_TIME):
        assert f"django_idempotency_{metric.name}" in alerted, metric.name
    for metric in (*signatures, metrics.EXECUTION_TIME, metrics.REPLAY_AGE):
        assert f"django_idempotency_{metric.name}" in charted, metric.name


def test_alert_rules_have_the_fields_prometheus_needs():
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"page", "ticket"}
        assert rule["annotations"]["summary"]


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_datasource():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs))


def test_promtool_accepts_the_alert_rules(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    path = tmp_path / "alerts.yml"
    path.write_text((MONITORING / "alerts.yml").read_text())
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
