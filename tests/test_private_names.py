"""No module of the package imports another module's private names (``_name``).

A private name is a module's own business: another module that needs it needs a public
name, or the code belongs where the name is. import-linter's contracts (``make lint``)
keep the layers; this keeps the modules' insides apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "django_idempotency"


def private_imports(source: str) -> list[str]:
    """``module.name`` for each private name ``source`` imports from the package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "django_idempotency"
        ):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_the_check_finds_a_private_import():
    assert private_imports("from django_idempotency.store.sql import _NOW, PG_CLAIM_SQL") == [
        "django_idempotency.store.sql._NOW"
    ]
    assert private_imports("from django_idempotency import __version__ as v") == [
        "django_idempotency.__version__"
    ]


def test_no_module_imports_another_modules_private_names():
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := [n for n in private_imports(path.read_text()) if not n.endswith("__")])
    }
    assert offenders == {}
