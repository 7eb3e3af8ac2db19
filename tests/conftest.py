from __future__ import annotations

import collections
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from rest_framework.test import APIClient

from django_idempotency.store import isolation as store_isolation
from tests.support.clients import client_for
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import GATES, HOOKS, Gate


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress", action="store_true", help="run long stress tests")
    parser.addoption(
        "--stress-scale",
        type=float,
        default=1.0,
        help="with --stress: multiply the concurrency tests' stress rounds (CI: < 1)",
    )
    parser.addoption(
        "--pg-restart",
        action="store_true",
        help="run the tests that restart the PostgreSQL server (pg_ctlcluster): they "
        "disturb every other client of that server",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    on_postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://...")
    skip_slow = pytest.mark.skip(reason="stress run: pass --stress")
    skip_restart = pytest.mark.skip(reason="restarts PostgreSQL: pass --pg-restart")
    for item in items:
        if "pg_restart" in item.keywords and not config.getoption("--pg-restart"):
            item.add_marker(skip_restart)
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
        if "slow" in item.keywords and not config.getoption("--stress"):
            item.add_marker(skip_slow)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per reason tests were skipped, with how many, instead of one per test."""
    reasons: collections.Counter[str] = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section("skipped, by reason")
    for reason, count in reasons.most_common():
        if reason.startswith("needs PostgreSQL"):
            reason = (
                "need PostgreSQL; to run them: "
                "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres make test"
            )
        terminalreporter.write_line(f"{count:5} {reason}")


def _on_postgres() -> bool:
    from django.conf import settings

    return bool(settings.DATABASES["default"]["ENGINE"].endswith("postgresql"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # ``record_table``: every test using it runs on each kind of record table the
    # backend has - the plain table and the day-partitioned one on PostgreSQL.
    if "record_table" in metafunc.fixturenames:
        kinds = ["plain", "partitioned"] if _on_postgres() else ["sqlite"]
        metafunc.parametrize("record_table", kinds, indirect=True)


@pytest.fixture
def record_table(request: pytest.FixtureRequest, transactional_db: Any) -> Iterator[str]:
    """The test database's record table as the parameter says; restored afterwards.

    ``plain``: the table of a project with ``PARTITION_RECORDS = False`` (unique
    constraint, the store's ORM statements); ``partitioned``: the default on
    PostgreSQL (the claim function); ``sqlite``: SQLite's plain table.
    """
    kind: str = request.param
    if kind == "partitioned":
        _days_ahead_as_the_sweeper_keeps_them()
    if kind != "plain":
        yield kind
        return
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.store.schema import tables

    with connection.schema_editor() as editor:
        tables.to_plain(connection, editor, IdempotencyRecord)
    try:
        yield kind
    finally:
        connections.close_all()  # threads' connections are gone; ours re-reads the kind
        from django_idempotency.store import clock

        now = clock.store_now(connection)
        days = [now.date() + dt.timedelta(days=n) for n in range(3)]
        with transaction.atomic():
            tables.install_functions(connection)
            tables.to_partitioned(
                connection, keep_since=dt.datetime(1970, 1, 1, tzinfo=dt.UTC), days=days
            )


def _days_ahead_as_the_sweeper_keeps_them() -> None:
    """Today's partition and the days ahead, which a test's sweep in the future drops:
    without them the next test's claims would land in the default partition."""
    from django_idempotency.retention import partitions
    from django_idempotency.store import clock
    from django_idempotency.store.schema.tables import days_ahead

    today = clock.store_now(connection).date()
    attached = {p.day for p in partitions.list_partitions(connection) if p.attached}
    for n in range(days_ahead() + 1):
        if today + dt.timedelta(days=n) not in attached:
            partitions.ensure(connection, today + dt.timedelta(days=n))


def _close_broken_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        if not conn.get_autocommit() or not conn.is_usable():
            conn.close()  # the next query connects afresh


@pytest.fixture(autouse=True)
def _fresh_broken_connections(
    request: pytest.FixtureRequest, django_db_blocker: Any
) -> Iterator[None]:
    """A test that killed or broke its connection does not hand it to the next one.

    Fault tests terminate backends; should one fail halfway, the dead connection would
    otherwise fail the database teardown (flush) and every later test. Checked before
    the test and after it, before pytest-django's own teardown (set up first, below).
    """
    with django_db_blocker.unblock():
        _close_broken_connections()
    if request.node.get_closest_marker("django_db"):
        request.getfixturevalue("_django_db_helper")  # so its teardown runs after ours
    yield
    with django_db_blocker.unblock():
        _close_broken_connections()


@pytest.fixture
def alice(db: Any) -> Any:
    return TokenFactory(user__username="alice")


@pytest.fixture
def bob(db: Any) -> Any:
    return TokenFactory(user__username="bob")


@pytest.fixture
def api(alice: Any) -> APIClient:
    return client_for(alice)


@pytest.fixture
def key() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def gate() -> Iterator[tuple[str, Gate]]:
    name = uuid.uuid4().hex
    GATES[name] = Gate()
    yield name, GATES[name]
    GATES[name].opened.set()
    del GATES[name]


#: The record table's day partitions as ``migrate`` made them (PostgreSQL), read before
#: any test runs: a test's sweep in the future drops the days it finds past
#: (tests/store/test_schema.py).
MIGRATED_PARTITIONS: set[str] = set()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test databases, and what their migration made, recorded."""
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            from django_idempotency.retention import partitions

            MIGRATED_PARTITIONS.update(p.name for p in partitions.list_partitions(connection))
    yield


@pytest.fixture(autouse=True)
def _clear_hooks() -> Iterator[None]:
    yield
    HOOKS.clear()


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The transaction commands psycopg sends by itself (its own ``BEGIN``, ``COMMIT``).

    Statements sent through a cursor (Django's, or the app's own) are not in it.
    """
    from psycopg import _connection_base

    seen: list[bytes] = []
    real = _connection_base.BaseConnection._exec_command

    def spy(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(bytes(command) if isinstance(command, bytes) else str(command).encode())
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(_connection_base.BaseConnection, "_exec_command", spy)
    return seen


@pytest.fixture
def server_repeatable_read() -> Any:
    """The server (not Django's OPTIONS) defaults the test database to REPEATABLE READ.

    Undone after the test, with what claims found out about it (PostgreSQL only).
    """

    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
        )
    connections.close_all()
    try:
        yield
    finally:
        connections.close_all()
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_isolation')
        connections.close_all()
        store_isolation.strict_databases.discard("default")


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """The SQL of every statement the test's default connection executes."""
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen
