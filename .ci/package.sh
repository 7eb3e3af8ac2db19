#!/usr/bin/env bash
# The package as PyPI would ship it (`make package`):
#
#   1. `python -m build` makes the sdist and the wheel in dist/;
#   2. `twine check --strict` checks their metadata (the README renders);
#   3. .ci/wheel_contents.py checks what the wheel holds: the templates, the migrations
#      and py.typed, and no tests, benchmarks or example project;
#   4. the wheel (not an editable install) goes into a fresh virtual environment with
#      the example project's dependencies, and the example project, copied away from
#      the checkout so that nothing imports the source tree, runs its system checks and
#      its demo: a client over real HTTP against the installed package; and the
#      `idempotency-conformance` script it installs lists its checks.
#
# Variables: PYTHON (python3), PACKAGE_DIR (a scratch directory; default a new one
# under /tmp, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SCRATCH="${PACKAGE_DIR:-$(mktemp -d /tmp/django-idempotency-package.XXXXXX)}"
trap 'rm -rf "$SCRATCH"' EXIT

"$PYTHON" -m venv "$SCRATCH/tools"
"$SCRATCH/tools/bin/python" -m pip install --quiet --upgrade pip build twine
rm -rf dist
"$SCRATCH/tools/bin/python" -m build --outdir dist . >"$SCRATCH/build.log" 2>&1 || {
  tail -40 "$SCRATCH/build.log"
  exit 1
}
"$SCRATCH/tools/bin/twine" check --strict dist/*
"$SCRATCH/tools/bin/python" .ci/wheel_contents.py dist/*.whl

"$PYTHON" -m venv "$SCRATCH/installed"
"$SCRATCH/installed/bin/python" -m pip install --quiet --upgrade pip
"$SCRATCH/installed/bin/python" -m pip install --quiet dist/*.whl \
  "django-environ>=0.11" "httpx>=0.27" "stamina>=25.1" "psycopg[binary]>=3.1" "celery>=5.3"
cp -r example_project "$SCRATCH/example_project"
rm -rf "$SCRATCH/example_project/var"
cd "$SCRATCH/example_project"
env -u DATABASE_URL -u PYTHONPATH "$SCRATCH/installed/bin/python" - <<'EOF'
import django_idempotency

where = django_idempotency.__file__
assert "site-packages" in where, f"the example imports {where}, not the installed wheel"
print(f"django_idempotency {django_idempotency.__version__} from {where}")
EOF
env -u DATABASE_URL -u PYTHONPATH "$SCRATCH/installed/bin/python" manage.py check --fail-level WARNING
# The console script of the conformance check is installed, and imports from the wheel.
env -u DATABASE_URL -u PYTHONPATH "$SCRATCH/installed/bin/idempotency-conformance" --list-checks >/dev/null
env -u DATABASE_URL -u PYTHONPATH "$SCRATCH/installed/bin/python" demo.py
