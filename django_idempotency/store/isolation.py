"""Which transaction a statement of the store runs in (docs/storage.md).

A claim commits on its own (:func:`own_transaction`); where the server's default
isolation turns out to be stricter than Django was told, claims open their own READ
COMMITTED transaction from then on (:func:`stricter_than_read_committed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

from django.db import (
    DatabaseError,
    transaction,
)

#: SQLSTATE raised by the partitioned claim function outside READ COMMITTED.
NOT_READ_COMMITTED = "0A000"


#: Aliases whose server turned out to default to a stricter isolation level.
strict_databases: set[str] = set()


#: SQLSTATE of serialization_failure: at REPEATABLE READ or SERIALIZABLE, a fenced
#: statement found our record changed since the view's snapshot (a takeover).
SERIALIZATION_FAILURE = "40001"


def own_transaction(connection: Any) -> bool:
    """Whether a statement on ``connection`` commits on its own (autocommit, no block).

    False inside an ``atomic()`` block and with manual transactions
    (``set_autocommit(False)``, ``AUTOCOMMIT: False``): the statement then joins the
    caller's transaction, which may hold the caller's own writes.
    """
    return not connection.in_atomic_block and connection.get_autocommit()


def claim_transaction(connection: Any) -> AbstractContextManager[None]:
    """The transaction a PostgreSQL claim statement runs in.

    Normally none of its own: the statement commits at once (autocommit). Inside a
    caller's atomic block (``ATOMIC_REQUESTS``, a test case) the claim cannot commit on
    its own; a savepoint at least keeps a failure from poisoning that block. When the
    database's isolation level is stricter than READ COMMITTED, the claim opens its own
    READ COMMITTED transaction: its look-up must see every row committed before the
    scope's lock was granted, and a snapshot taken earlier would not.
    """
    if not own_transaction(connection):  # an atomic block, or manual transactions
        block: AbstractContextManager[None] = transaction.atomic(using=connection.alias)
        return block
    if stricter_than_read_committed(connection):
        return _read_committed(connection)
    return nullcontext()


@contextmanager
def _read_committed(connection: Any) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    try:
        yield
    except BaseException:
        with suppress(DatabaseError), connection.cursor() as cursor:  # keep the cause
            cursor.execute("ROLLBACK")
        raise
    with connection.cursor() as cursor:
        cursor.execute("COMMIT")


def stricter_than_read_committed(connection: Any) -> bool:
    """Whether transactions on ``connection`` run above READ COMMITTED.

    ``True`` for PostgreSQL databases whose ``OPTIONS["isolation_level"]`` is
    REPEATABLE READ or SERIALIZABLE, and for those whose server default is (``ALTER
    DATABASE/ROLE ... SET default_transaction_isolation``), once a claim found it out;
    ``False`` for every other database.
    """
    if connection.vendor != "postgresql":
        return False
    if connection.alias in strict_databases:  # the server's default, seen by a claim
        return True
    level = connection.settings_dict.get("OPTIONS", {}).get("isolation_level")
    if level is None:
        return False
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    try:
        return IsolationLevel(level) in (
            IsolationLevel.REPEATABLE_READ,
            IsolationLevel.SERIALIZABLE,
        )
    except ValueError:
        return False
