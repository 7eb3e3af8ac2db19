from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.factories import TokenFactory
from tests.testapp.gates import GATES, HOOKS, Gate


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress", action="store_true", help="run long stress tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    on_postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://...")
    skip_slow = pytest.mark.skip(reason="stress run: pass --stress")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
        if "slow" in item.keywords and not config.getoption("--stress"):
            item.add_marker(skip_slow)


@pytest.fixture
def alice(db: Any) -> Any:
    return TokenFactory(user__username="alice")


@pytest.fixture
def bob(db: Any) -> Any:
    return TokenFactory(user__username="bob")


def client_for(token: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


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


@pytest.fixture(autouse=True)
def _clear_hooks() -> Iterator[None]:
    yield
    HOOKS.clear()


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"
