"""W014: a database holding records has this version's server-side functions, or a warning.

Each test changes the functions inside the test's transaction, rolled back after it.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from django_idempotency.checks.functions import check_installed_functions
from django_idempotency.store.schema import functions
from django_idempotency.store.schema.functions import COMPLETE_FUNCTION
from django_idempotency.store.schema.installed import code_bodies, stale_functions

pytestmark = pytest.mark.django_db


def ids(messages: list) -> list[str]:
    return [m.id for m in messages]


def test_a_database_migrated_by_this_version_passes():
    assert stale_functions(connection) == []
    assert check_installed_functions(databases=["default"]) == []


def test_only_the_databases_django_asks_for_are_read(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert check_installed_functions(databases=None) == []
        assert check_installed_functions(databases=["no-such-alias"]) == []


@pytest.mark.postgres
def test_a_function_with_another_body_is_named():
    older = COMPLETE_FUNCTION.replace("RETURN 1;", "RETURN 2;")
    assert older != COMPLETE_FUNCTION
    with connection.cursor() as cursor:
        cursor.execute(older)
    assert stale_functions(connection) == ["django_idempotency_complete"]
    (message,) = check_installed_functions(databases=["default"])
    assert message.id == "django_idempotency.W014"
    assert "'default'" in message.msg and "django_idempotency_complete" in message.msg
    assert "migrate django_idempotency" in message.hint


@pytest.mark.postgres
def test_a_missing_function_is_named():
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid::regprocedure::text FROM pg_proc "
                       "WHERE proname = 'django_idempotency_complete'")  # fmt: skip
        (signature,) = cursor.fetchone()
        cursor.execute(f"DROP FUNCTION {signature}")
    assert stale_functions(connection) == ["django_idempotency_complete"]


@pytest.mark.postgres
def test_the_check_runs_with_check_database_and_does_not_stop_it():
    with connection.cursor() as cursor:
        cursor.execute(COMPLETE_FUNCTION.replace("RETURN 1;", "RETURN 2;"))
    try:
        call_command("check", "--database", "default", "--fail-level", "ERROR")
    except SystemCheckError as exc:  # pragma: no cover - a failure's message
        pytest.fail(f"W014 stopped the command: {exc}")
    with pytest.raises(SystemCheckError, match="W014"):
        call_command("check", "--database", "default", "--fail-level", "WARNING")


def test_the_code_bodies_are_read_from_their_definitions():
    bodies = code_bodies(COMPLETE_FUNCTION)
    assert list(bodies) == ["django_idempotency_complete"]
    assert "RETURN 1;" in bodies["django_idempotency_complete"]
    with pytest.raises(ValueError, match="not a function definition"):
        code_bodies("CREATE TRIGGER t BEFORE INSERT ON x EXECUTE FUNCTION f()")


def test_the_latest_migration_freezes_this_versions_functions():
    """A migration installs the functions' SQL as it was written then; a version that
    changes one must add a migration with its new text, or a fresh database would
    hold the old one (and W014 would flag every new install)."""
    import importlib
    import pkgutil

    import django_idempotency.migrations as package

    latest: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name in ("COMPLETE_FUNCTION", "CLAIM_FUNCTION", "SCOPE_TRIGGER_FUNCTION"):
            if hasattr(module, name):
                latest[name] = getattr(module, name)
    assert latest == {
        "COMPLETE_FUNCTION": functions.COMPLETE_FUNCTION,
        "CLAIM_FUNCTION": functions.CLAIM_FUNCTION,
        "SCOPE_TRIGGER_FUNCTION": functions.SCOPE_TRIGGER_FUNCTION,
    }
