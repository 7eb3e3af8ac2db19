"""The example project (example_project/): its demo end to end, and its hygiene.

The demo runs as a user runs it: ``python example_project/demo.py`` in a subprocess,
which migrates a fresh database, starts the leasebroker server and talks to it over
real HTTP. SQLite always; PostgreSQL too when the suite runs on PostgreSQL.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings

from tests.support.example_project import run_in_example, sqlite_url


def assert_demo_passed(returncode: int, output: str) -> None:
    assert returncode == 0, output
    assert re.search(r"^all \d+ checks passed$", output, re.MULTILINE), output
    assert "FAIL" not in output, output
    # Step 2: the retry is a replay of the 201.
    assert re.search(r"<- 201 Created .*Idempotent-Replayed: true", output), output
    # Step 3: same key, different body.
    unprocessable = r"<- 422 Unprocessable (Entity|Content) .*application/problem\+json"
    assert re.search(unprocessable, output), output  # Python 3.13 says "Content"
    # Step 4: a concurrent duplicate gets 409 with Retry-After; the reboot ran once.
    assert re.search(r"<- 409 Conflict .*Retry-After: \d+", output), output
    assert "reboots before: 0, after: 1" in output, output
    # Step 6 and 8: a missing key, and a replayed delete.
    assert re.search(r"<- 400 Bad Request .*application/problem\+json", output), output
    assert re.search(r"<- 204 No Content .*Idempotent-Replayed: true", output), output


def test_demo_passes_on_a_fresh_sqlite_database(tmp_path: Path) -> None:
    returncode, output = run_in_example(["demo.py"], sqlite_url(tmp_path))

    assert_demo_passed(returncode, output)
    assert (tmp_path / "leasebroker.sqlite3").is_file()


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A throwaway PostgreSQL database on the suite's server; its URL. Dropped after."""
    import psycopg

    db = settings.DATABASES["default"]
    name = f"leasebroker_demo_{uuid.uuid4().hex[:10]}"
    params = {
        "host": db.get("HOST") or "127.0.0.1",
        "port": str(db.get("PORT") or 5432),
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or "",
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    credentials = quote(params["user"], safe="")
    if params["password"]:
        credentials += ":" + quote(params["password"], safe="")
    try:
        yield f"postgres://{credentials}@{params['host']}:{params['port']}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
def test_demo_passes_on_a_fresh_postgres_database(postgres_database: str) -> None:
    returncode, output = run_in_example(
        ["demo.py", "--database-url", postgres_database], postgres_database
    )

    assert_demo_passed(returncode, output)
    assert "database: postgres://" in output


def test_example_project_system_checks_are_clean(tmp_path: Path) -> None:
    returncode, output = run_in_example(["manage.py", "check"], sqlite_url(tmp_path))

    assert returncode == 0, output
    assert "System check identified no issues (0 silenced)." in output


def test_example_project_migrations_are_up_to_date(tmp_path: Path) -> None:
    returncode, output = run_in_example(
        ["manage.py", "makemigrations", "--check", "--dry-run", "workers"], sqlite_url(tmp_path)
    )

    assert returncode == 0, output
    assert "No changes detected in app 'workers'" in output


def test_create_demo_principals_can_run_twice(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert run_in_example(["manage.py", "migrate", "--noinput", "-v", "0"], url)[0] == 0

    first_code, first = run_in_example(["manage.py", "create_demo_principals"], url)
    second_code, second = run_in_example(["manage.py", "create_demo_principals"], url)

    assert first_code == second_code == 0, first + second
    alice, bob = "alice-demo-token-" + "0" * 23, "bob-demo-token-" + "0" * 25
    assert f"created alice  Authorization: Token {alice}" in first
    assert f"created bob    Authorization: Token {bob}" in first
    assert f"exists  alice  Authorization: Token {alice}" in second
    assert f"exists  bob    Authorization: Token {bob}" in second
