"""SQL statements per request: what idempotency adds to a view's own queries.

Measured with ``CaptureQueriesContext`` on the real path (``transaction=True``: no
test transaction around the request, so the claim commits on its own and is not
wrapped in a savepoint). Django (4.2+) logs transaction control too: ``BEGIN``,
``COMMIT``, ``ROLLBACK``. Each test warms the connection up with one keyed request
first: the first claim on a new database connection also asks PostgreSQL once
whether the record table is partitioned (cached per connection).

The contract (docs/benchmarks.md):

* PostgreSQL, keyed first execution: the view's own statements + the claim (1
  statement) + the completion (1 statement, the server-side function), plus the view's
  transaction's ``BEGIN`` and ``COMMIT``: 4 round trips more than the same view
  unkeyed (tests/store/test_claim_commit.py counts what psycopg sends).
* PostgreSQL, replay: authentication + exactly 1 statement (the claim, which returns
  the stored response). The view does not run. A key reused with another body (422)
  costs the same.
* SQLite, keyed first execution: the claim is ``BEGIN``, ``INSERT``, ``COMMIT`` (3),
  the view's block adds ``BEGIN``/``COMMIT``, the completion 1: 6 more than unkeyed,
  2 of them data statements.
* SQLite, replay: ``BEGIN``, the failing ``INSERT``, ``ROLLBACK``, a ``SELECT``.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.support.clients import client_for

pytestmark = pytest.mark.django_db(transaction=True)

CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE SAVEPOINT)\b", re.I)
RECORD_TABLE = "django_idempotency"
AUTH_STATEMENTS = 1  # TokenAuthentication: one SELECT of the token and its user


def capture(
    api: APIClient,
    key: str | None,
    *,
    status: int = 201,
    body: dict[str, Any] | None = None,
    path: str = "/optional",
) -> list[str]:
    """POST ``path`` (/optional: Widget create + count), with ``key`` or unkeyed; its SQL."""
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with CaptureQueriesContext(connection) as ctx:
        response = api.post(path, body or {}, format="json", **headers)
    assert response.status_code == status, response.content
    return [q["sql"] for q in ctx.captured_queries]


def data(statements: list[str]) -> list[str]:
    return [s for s in statements if not CONTROL.match(s)]


def control(statements: list[str]) -> list[str]:
    return [s.split()[0].upper() for s in statements if CONTROL.match(s)]


def on_record_table(statements: list[str]) -> list[str]:
    return [s for s in data(statements) if RECORD_TABLE in s]


@pytest.fixture
def api(alice: Any) -> APIClient:
    client = client_for(alice)
    capture(client, f"warm-up-{uuid.uuid4()}")  # connection set up, table kind cached
    return client


def test_unkeyed_request_runs_the_view_alone(api: APIClient) -> None:
    unkeyed = capture(api, None)

    assert len(data(unkeyed)) == AUTH_STATEMENTS + 2  # auth, INSERT widget, COUNT
    assert on_record_table(unkeyed) == []


def test_keyed_first_execution_costs_the_claim_and_the_completion(
    api: APIClient, on_postgres: bool
) -> None:
    unkeyed = capture(api, None)
    keyed = capture(api, str(uuid.uuid4()))

    if on_postgres:
        claim, completion = on_record_table(keyed)
        assert len(data(keyed)) == len(data(unkeyed)) + 2
        # The fenced UPDATE in its server-side function (with owner presence it also
        # releases the presence lock), a statement of its own.
        assert completion.startswith("SELECT django_idempotency_complete(")
        assert "COMMIT" not in completion
        # The view's transaction: BEGIN, then the block's COMMIT after the completion.
        assert control(keyed) == ["BEGIN", "COMMIT"]
        assert keyed.index(completion) < len(keyed) - 1
        assert control(keyed[keyed.index(completion) + 1 :]) == ["COMMIT"]
        assert len(keyed) == len(unkeyed) + 4
    else:
        # SQLite: the claim looks for the key, then inserts in its own BEGIN / COMMIT.
        look, claim, completion = on_record_table(keyed)
        assert len(data(keyed)) == len(data(unkeyed)) + 3
        assert look.lstrip().upper().startswith("SELECT")
        assert claim.lstrip().upper().startswith("INSERT")
        assert "completed" in completion and re.match(r"\s*UPDATE\b", completion, re.I)
        assert control(keyed) == ["BEGIN", "COMMIT", "BEGIN", "COMMIT"]
        assert len(keyed) == len(unkeyed) + 7


def test_a_replay_costs_one_statement(api: APIClient) -> None:
    key = str(uuid.uuid4())
    capture(api, key)

    replay = capture(api, key)

    # PostgreSQL: the claim, which finds the completed record; SQLite: the look for the
    # key, which finds it. No BEGIN: the statement autocommits; nothing is written.
    assert len(on_record_table(replay)) == 1
    assert len(replay) == AUTH_STATEMENTS + 1
    assert control(replay) == []


def test_the_table_kind_is_asked_once_per_process_not_per_connection(
    alice: Any, on_postgres: bool
) -> None:
    from django_idempotency.store.catalog import forget

    forget()
    api = client_for(alice)
    first = capture(api, str(uuid.uuid4()))
    connection.close()  # CONN_MAX_AGE = 0: every request gets a new connection
    second = capture(api, str(uuid.uuid4()))
    third = capture(api, str(uuid.uuid4()))

    extra = 1 if on_postgres else 0  # PostgreSQL: is the record table partitioned?
    assert len(first) == len(third) + extra
    assert len(second) == len(third)


def test_a_reused_key_costs_what_a_replay_costs(api: APIClient) -> None:
    key = str(uuid.uuid4())
    capture(api, key)

    reused = capture(api, key, status=422, body={"other": "body"})

    assert len(on_record_table(reused)) == 1
    assert len(reused) == AUTH_STATEMENTS + 1


def test_a_block_around_the_views_whole_body_costs_a_savepoint_and_its_release(
    api: APIClient, on_postgres: bool
) -> None:
    """The view's own ``transaction.atomic()`` is a savepoint in the app's transaction.

    What docs/storage.md says a block around a keyed view's whole body costs: the
    ``SAVEPOINT`` and its ``RELEASE SAVEPOINT``, two statements and nothing more.
    """
    plain = capture(api, str(uuid.uuid4()))  # /optional: no block of its own
    blocked = capture(api, str(uuid.uuid4()), path="/tx/atomic-below")

    view_transaction = control(blocked)[-4:]
    assert view_transaction == ["BEGIN", "SAVEPOINT", "RELEASE", "COMMIT"]
    assert "SAVEPOINT" not in control(plain)
    # The same claim and completion around both views.
    assert len(on_record_table(blocked)) == len(on_record_table(plain))
    if on_postgres:
        assert control(blocked) == view_transaction
