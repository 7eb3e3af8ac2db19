"""Schema-per-tenant projects with the real django-tenants on PostgreSQL (docs/tenants.md).

django-tenants needs its own database backend, router and apps, which the main suite's
settings cannot share, so tests/tenants/scenarios.py runs in a pytest of its own, with
``tests.tenants.settings`` and its own database (tests/tenants/plugin.py), once for this
module; each test here is one scenario function of it, and passes when every case of
that function passed there.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "tenants" / "scenarios.py"

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        importlib.util.find_spec("django_tenants") is None,
        reason="needs django-tenants (the tenants extra; Django 5.2 or later): "
        'pip install "django-idempotency[tenants]"',
    ),
]


def scenario_names() -> list[str]:
    """The test functions of tests/tenants/scenarios.py, in file order."""
    tree = ast.parse(SCENARIOS.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str | None]]:
    """Each scenario case's failure text (``None``: passed), by case name."""
    report = tmp_path_factory.mktemp("tenants") / "report.xml"
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": (
            f"postgres://{db.get('USER') or 'postgres'}@{db.get('HOST') or '127.0.0.1'}:"
            f"{db.get('PORT') or 5432}/postgres"
        ),
        "PYTHONPATH": str(ROOT),
    }
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    env.pop("DJANGO_SETTINGS_MODULE", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--noconftest",
            "-p",
            "tests.tenants.plugin",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--ds",
            "tests.tenants.settings",
            f"--junitxml={report}",
            "-q",
            str(SCENARIOS),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    if not report.exists():
        pytest.fail(f"the tenant suite did not run:\n{run.stdout}\n{run.stderr}")
    found: dict[str, list[str | None]] = {}
    for case in ET.parse(report).iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        text = None if problem is None else (problem.text or problem.get("message") or "failed")
        if skipped is not None:
            text = f"skipped: {skipped.get('message')}"
        found.setdefault(case.get("name", "").split("[")[0], []).append(text)
    return found


@pytest.mark.parametrize("scenario", scenario_names())
def test_tenant_scenario(scenario: str, outcomes: dict[str, list[str | None]]) -> None:
    cases = outcomes.get(scenario)
    assert cases, f"{scenario} did not run in the tenant suite"
    failures = [text for text in cases if text is not None]
    assert not failures, "\n\n".join(failures)
