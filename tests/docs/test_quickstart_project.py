"""The quick start and the testing page, run as a new user would run them.

Builds the quick start's ``shop`` project in a temporary folder from the code blocks
of docs/quickstart.md (settings, model, view, URLs), adds the test modules of
docs/testing.md, and runs them with pytest in a subprocess, on SQLite. A change to the
app or the docs that breaks the example a user copies fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: "`orders/views.py`:" (or "Add to the end of `shop/settings.py`:") then a Python block.
BLOCK = re.compile(
    r"^(?P<lead>[^\n]*)`(?P<path>[\w/]+\.py)`:\n\n```python\n(?P<code>.*?)^```", re.M | re.S
)


def _files(page: Path) -> list[tuple[str, str, bool]]:
    """(path, code, append) for every block of ``page`` that names its file."""
    return [
        (m["path"], m["code"], "add to" in m["lead"].lower())
        for m in BLOCK.finditer(page.read_text())
    ]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONPATH")}
    env["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tmp_path_factory.mktemp("shop")
    for args in (
        ["-m", "django", "startproject", "shop", "."],
        ["manage.py", "startapp", "orders"],
    ):
        done = _run(args, project)
        assert done.returncode == 0, done.stderr
    for page in (DOCS / "quickstart.md", DOCS / "testing.md"):
        for path, code, append in _files(page):
            target = project / path
            if append:
                target.write_text(target.read_text() + "\n" + code)
            else:
                target.write_text(code)
    done = _run(["manage.py", "makemigrations", "orders"], project)
    assert done.returncode == 0, done.stderr
    return project


def test_the_pages_name_the_files_the_example_needs() -> None:
    quick = {path for path, _, _ in _files(DOCS / "quickstart.md")}
    testing = {path for path, _, _ in _files(DOCS / "testing.md")}

    assert {"shop/settings.py", "orders/models.py", "orders/views.py", "shop/urls.py"} <= quick
    assert {"shop/settings.py", "orders/tests.py", "orders/test_races.py"} <= testing


def test_the_testing_page_examples_pass_against_the_quick_start_project(shop: Path) -> None:
    modules = ["orders/tests.py", "orders/test_races.py"]
    done = _run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--ds", "shop.settings", *modules], shop
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b9 passed\b", done.stdout), done.stdout
