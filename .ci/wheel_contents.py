"""Check what a built wheel of django-idempotency holds (run by .ci/package.sh).

Usage: ``python .ci/wheel_contents.py dist/django_idempotency-0.1.0-py3-none-any.whl``.
Exit status 1, with what is wrong, when a file the app needs at run time is missing
(``py.typed``, the admin templates, the migrations, the management commands) or when
the wheel carries anything besides the package and its metadata (tests, benchmarks,
the example project, caches).
"""

from __future__ import annotations

import sys
import zipfile

PACKAGE = "django_idempotency/"
#: Files the installed app cannot do without.
REQUIRED = (
    "django_idempotency/py.typed",
    "django_idempotency/migrations/__init__.py",
    "django_idempotency/migrations/0001_initial.py",
    "django_idempotency/management/commands/idempotency_relay.py",
    "django_idempotency/management/commands/idempotency_sweep.py",
    "django_idempotency/templates/django_idempotency/browsable_api.html",
    "django_idempotency/static/django_idempotency/browsable_api.js",
    "django_idempotency/monitoring/alerts.yml",
    "django_idempotency/monitoring/dashboard.json",
)
#: At least one admin template (the app's own change-list and confirmation pages).
TEMPLATES = "django_idempotency/templates/"


def problems(names: list[str]) -> list[str]:
    """What is wrong with a wheel holding the files ``names``; empty when nothing is."""
    found = set(names)
    wrong = [f"missing: {name}" for name in REQUIRED if name not in found]
    if not any(name.startswith(TEMPLATES) and name.endswith(".html") for name in names):
        wrong.append(f"missing: the admin templates ({TEMPLATES}**/*.html)")
    for name in names:
        top = name.split("/", 1)[0]
        if name.startswith(PACKAGE):
            if "__pycache__" in name or name.endswith(".pyc"):
                wrong.append(f"a cache in the wheel: {name}")
        elif not top.endswith(".dist-info"):
            wrong.append(f"not part of the package: {name}")
    return wrong


def main(paths: list[str]) -> int:
    """Check each wheel of ``paths``; 0 when all hold what they should, else 1."""
    if not paths:
        print(__doc__)
        return 2
    status = 0
    for path in paths:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
        wrong = problems(names)
        for line in wrong:
            print(f"{path}: {line}")
        if wrong:
            status = 1
        else:
            print(f"{path}: {len(names)} files, the package and its metadata only")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
