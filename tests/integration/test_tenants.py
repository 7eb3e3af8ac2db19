"""Schema-per-tenant projects with the real django-tenants on PostgreSQL (docs/tenants.md).

django-tenants needs its own database backend, router and apps, which the main suite's
settings cannot share, so tests/tenants/scenarios*.py run in a pytest of their own, with
``tests.tenants.settings`` and its own database (tests/tenants/plugin.py), once per
layout of the app for this module: in ``TENANT_APPS`` only (``tenant``), and in
``SHARED_APPS`` too (``both``). Each test here is one scenario function in one layout,
and passes when every case of that function passed there.
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
#: The scenario modules (their names keep them out of the main suite's collection).
SCENARIOS = sorted((ROOT / "tests" / "tenants").glob("scenarios*.py"))

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        importlib.util.find_spec("django_tenants") is None,
        reason="needs django-tenants (the tenants extra; Django 5.2 or later): "
        'pip install "django-idempotency[tenants]"',
    ),
]


def scenario_names() -> list[str]:
    """The test functions of tests/tenants/scenarios*.py, in file order."""
    return [
        node.name
        for module in SCENARIOS
        for node in ast.parse(module.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


#: The layouts the suite runs in (``TENANTS_LAYOUT``, tests/tenants/settings.py).
LAYOUTS = ("tenant", "both")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[str | None]]]:
    """Each scenario case's failure text (``None``: passed), by layout and case name."""
    return {layout: _run(tmp_path_factory, layout) for layout in LAYOUTS}


def _run(tmp_path_factory: pytest.TempPathFactory, layout: str) -> dict[str, list[str | None]]:
    """Run the scenarios in ``layout``; each case's failure text by case name."""
    report = tmp_path_factory.mktemp(f"tenants-{layout}") / "report.xml"
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": (
            f"postgres://{db.get('USER') or 'postgres'}@{db.get('HOST') or '127.0.0.1'}:"
            f"{db.get('PORT') or 5432}/postgres"
        ),
        "PYTHONPATH": str(ROOT),
        "TENANTS_LAYOUT": layout,
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
            *map(str, SCENARIOS),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    if not report.exists():
        pytest.fail(f"the tenant suite ({layout}) did not run:\n{run.stdout}\n{run.stderr}")
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


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scenario", scenario_names())
def test_tenant_scenario(
    scenario: str, layout: str, outcomes: dict[str, dict[str, list[str | None]]]
) -> None:
    cases = outcomes[layout].get(scenario)
    assert cases, f"{scenario} did not run in the tenant suite ({layout})"
    failures = [text for text in cases if text is not None]
    assert not failures, "\n\n".join(failures)
