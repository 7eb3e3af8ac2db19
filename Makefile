# The two commands of the README:
#   make demo   set everything up, run leasebroker and a scripted client over real HTTP
#   make test   set everything up, run the test suite (SQLite; DATABASE_URL for PostgreSQL)
# Also: make stress (the concurrency tests, many rounds, PostgreSQL), make mutation
# (does the suite notice when a condition of the protocol is removed?
# docs/contributing/mutation.md), make package (the sdist and wheel, built, checked and
# installed alone under the example project).
# Variables: PYTHON (interpreter for the venv), VENV (its folder), DJANGO_SPEC / DRF_SPEC
# (pin Django / DRF, e.g. "Django>=4.2,<5.0"), DATABASE_URL (the suite's and the demo's
# database), STRESS_SCALE (make stress: fraction of its rounds, e.g. 0.3 in CI),
# PYTEST_ARGS (extra pytest arguments, e.g. a module or -k).
# make test-pgbouncer   the pooler pass: the tests marked pooled, through PgBouncer in
#                       transaction pooling mode (needs DATABASE_URL=postgres://...;
#                       docs/contributing/index.md)

PYTHON ?= python3
VENV ?= .venv
DJANGO_SPEC ?=
DRF_SPEC ?=
STRESS_SCALE ?= 1
PYTEST_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-pgbouncer stress mutation storm lint docs package install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,example,celery,lint,docs]" $(if $(DJANGO_SPEC),"$(DJANGO_SPEC)") $(if $(DRF_SPEC),"$(DRF_SPEC)")
	@# django-celery-beat only where it supports the Django just installed (it caps
	@# Django's version): elsewhere its tests are skipped, with the reason.
	@$(BIN)/python -m pip install --quiet -e ".[beat]" "Django==$$($(BIN)/python -c 'import django; print(django.__version__)')" >/dev/null 2>&1 \
		|| echo "django-celery-beat does not support this Django: tests/contrib/test_celery_beat.py is skipped"
	@# django-tenants likewise (it needs Django 5.2 or later): elsewhere the tenant suite
	@# (tests/integration/test_tenants.py) is skipped, with the reason.
	@$(BIN)/python -m pip install --quiet -e ".[tenants]" "Django==$$($(BIN)/python -c 'import django; print(django.__version__)')" >/dev/null 2>&1 \
		|| echo "django-tenants does not support this Django: tests/integration/test_tenants.py is skipped"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python example_project/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-pgbouncer: $(STAMP)
	@case "$$DATABASE_URL" in postgres*) ;; *) echo "make test-pgbouncer needs PostgreSQL: DATABASE_URL=postgres://... make test-pgbouncer"; exit 2;; esac
	.ci/pgbouncer.sh run $(BIN)/python -m pytest -p tests.support.pgbouncer -m pooled $(PYTEST_ARGS)

storm: $(STAMP)
	$(BIN)/python example_project/storm.py

stress: $(STAMP)
	@case "$$DATABASE_URL" in postgres*) ;; *) echo "make stress needs PostgreSQL: DATABASE_URL=postgres://... make stress"; exit 2;; esac
	$(BIN)/python -m pytest --stress --stress-scale $(STRESS_SCALE) tests/store/test_concurrency.py

# The sdist and wheel in dist/, checked, and the wheel installed in a fresh venv under
# the example project's checks and demo (.ci/package.sh).
package:
	PYTHON=$(PYTHON) .ci/package.sh

mutation: $(STAMP)
	$(BIN)/python tests/mutation/run.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check django_idempotency tests example_project
	$(BIN)/mypy django_idempotency
	$(BIN)/lint-imports

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venv-* example_project/var .pytest_cache
