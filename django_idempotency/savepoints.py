"""The view's savepoint statements, sent with its next statement or not at all.

Inside the app's transaction every ``transaction.atomic()`` block of the view is a
savepoint: ``SAVEPOINT`` when it opens, ``RELEASE SAVEPOINT`` when it closes, a round
trip each. While a single-transaction view runs on PostgreSQL, :class:`ViewSavepoints`
(an execute wrapper) holds these statements back and sends them in the same query as
the view's next statement, in order (psycopg 3's client-side-binding cursor, Django's
default, sends a query of several statements; the view reads its own statement's
result). Where that cursor is not in use (``executemany``, a named cursor, server-side
binding, psycopg2), the held statements go in a query of their own just before.

- **A release** changes nothing the next statement could observe: it only merges the
  savepoint's work into its parent. It is held while the transaction is healthy
  (PostgreSQL's ``INTRANS``); the ones still held when the view is done are dropped,
  because the transaction ends next (its ``COMMIT`` or ``ROLLBACK`` releases every
  savepoint). In an aborted transaction Django's release fails and Django handles that
  failure where it happens.
- **A savepoint** is held only when nothing has run in the transaction yet (``IDLE``:
  the view's first block): until a statement goes out it marks the transaction's
  start, and it goes out with that statement, which is where it belongs. A block that
  ran nothing is released or rolled back without a word to the server.
- **Statements past the wrappers** (psycopg's ``cursor.copy()``, the raw driver
  connection) are the one thing that can run while a savepoint is held. It is not sent
  after them (it would be in the wrong place): it keeps standing for the transaction's
  start, so a rollback to it is a ``ROLLBACK`` of the transaction, which undoes exactly
  what ran since it. Held releases are dropped when such a statement aborted the
  transaction: it can only go on by rolling back to a savepoint opened before them,
  which removes theirs as their release would have. Either way the view's blocks end
  as they would without the app.

Nothing is held while Django logs queries (``DEBUG``, ``assertNumQueries``,
``CaptureQueriesContext``): the log lists exactly the statements sent, as sent. Only
one wrapper is active per connection: an idempotent view called inside another one's
transaction leaves its statements to the outer one's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

#: Django's savepoint statements (``ops.savepoint_create_sql`` and its siblings), each
#: followed by the quoted name: ``RELEASE SAVEPOINT "s140_x1"``.
_SAVEPOINT = "SAVEPOINT "
_RELEASE = "RELEASE SAVEPOINT "
_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT "
#: libpq's ``PQTRANS_IDLE`` (no transaction: nothing sent since psycopg's last COMMIT or
#: ROLLBACK), ``PQTRANS_INTRANS`` (idle inside a healthy transaction block) and
#: ``PQTRANS_INERROR`` (inside a transaction a failed statement aborted).
_IDLE = 0
_INTRANS = 2
_INERROR = 3


class ViewSavepoints:
    """An execute wrapper (``connection.execute_wrapper``): savepoint statements late.

    Each is held back and sent with the view's next statement.

    Args:
        connection: the Django connection it wraps (PostgreSQL).

    Attributes:
        held: the ``RELEASE SAVEPOINT`` statements held back, in order.
        unsent: the quoted names of the savepoints opened before the transaction's
            first statement and not placed yet, outermost first.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.held: list[str] = []
        self.unsent: list[str] = []
        self._flushing = False

    def __call__(
        self, execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Hold a savepoint statement back; send the held ones with the next statement."""
        if self._flushing:
            return execute(sql, params, many, context)
        if (
            params is None
            and not many
            and isinstance(sql, str)
            and not self.connection.queries_logged  # the log shows what is sent, as sent
            and self._held_back(sql)
        ):
            return None
        return self._send(execute, sql, params, many, context)

    def _held_back(self, sql: str) -> bool:
        """Whether Django's savepoint statement ``sql`` is held back (or undone here)."""
        status = self._status()
        if sql.startswith(_SAVEPOINT):
            if status != _IDLE:
                return False
            # Nothing has run in the transaction yet: the savepoint marks its start
            # until a statement goes out, and then goes out with it.
            self.unsent.append(sql[len(_SAVEPOINT) :])
            return True
        if sql.startswith(_RELEASE):
            name = sql[len(_RELEASE) :]
            if name in self.unsent and status != _INERROR:
                # Released with every savepoint opened after it. (In an aborted
                # transaction it goes out and fails, as it would have been refused.)
                del self.unsent[self.unsent.index(name) :]
                return True
            if status == _INTRANS:
                self.held.append(sql)
                return True
            return False
        if sql.startswith(_ROLLBACK_TO):
            name = sql[len(_ROLLBACK_TO) :]
            if name not in self.unsent:
                return False
            del self.unsent[self.unsent.index(name) + 1 :]
            if status != _IDLE:
                # Only statements past the wrappers (psycopg's ``cursor.copy()``) ran
                # since the savepoint, which stands for the transaction's start: undo
                # them all. The savepoint stays, still to be placed, as after a
                # ROLLBACK TO, and psycopg begins the transaction again.
                self.held = []
                self._run("ROLLBACK")
            return True
        return False

    def _send(
        self, execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Run a statement, the held savepoint statements first.

        They go in the statement's own query where the driver's cursor takes several
        statements, else in one query of their own just before it.
        """
        status = self._status()
        placed: list[str] = []
        if status == _IDLE:  # otherwise past-wrapper statements ran: they stay unsent
            placed, self.unsent = self.unsent, []
        if self.held and status == _INERROR:
            # Sent, they would fail; the rollback to an earlier savepoint that must come
            # next removes their savepoints anyway.
            self.held = []
        prefix = [_SAVEPOINT + name for name in placed] + self.held
        if not prefix:
            return execute(sql, params, many, context)
        self.held = []
        cursor = getattr(context.get("cursor"), "cursor", None)
        if many or not isinstance(sql, str) or not _takes_several(cursor):
            self._run("; ".join(prefix))
            return execute(sql, params, many, context)
        try:
            result = execute("; ".join([*prefix, sql]), params, many, context)
        except BaseException:
            # A syntax error rejects the whole query, the savepoints with it: they
            # still stand for the transaction's start (a rollback to one of them is a
            # ROLLBACK), which is what they mark if they were placed after all.
            self.unsent = placed
            raise
        for _statement in prefix:  # the view reads its own statement's result
            cursor.nextset()
        return result

    def _status(self) -> int | None:
        info = getattr(self.connection.connection, "info", None)
        status = getattr(info, "transaction_status", None)
        return None if status is None else int(status)

    def _run(self, statements: str) -> None:
        self._flushing = True
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(statements)
        finally:
            self._flushing = False

    def drop(self) -> None:
        """Forget the held statements: the transaction ends next.

        Its ``COMMIT`` or ``ROLLBACK`` releases every savepoint; one never placed has
        nothing to release.
        """
        self.held = []
        self.unsent = []


def _takes_several(cursor: Any) -> bool:
    """Whether ``cursor`` sends several statements in one query and reads each result.

    psycopg 3's client-side-binding cursor (Django's default) does; a named (server-side)
    one, a server-side-binding one and psycopg2's do not.
    """
    try:
        import psycopg
    except ImportError:  # psycopg2: one result per query
        return False
    return isinstance(cursor, psycopg.ClientCursor) and not isinstance(cursor, psycopg.ServerCursor)


@contextmanager
def view_savepoints(using: str) -> Iterator[ViewSavepoints | None]:
    """Hold the view's releases back on ``using`` while the block runs (PostgreSQL).

    Yields the wrapper, or ``None`` on other databases and where an outer view's
    wrapper is active on the connection already. The caller calls
    :meth:`ViewSavepoints.drop` right before the statement that ends the transaction;
    held releases otherwise go out before the next statement.
    """
    connection = connections[using]
    if connection.vendor != "postgresql" or any(
        isinstance(active, ViewSavepoints) for active in connection.execute_wrappers
    ):
        # An idempotent view called inside another one's transaction: the outer view's
        # wrapper already sees every statement (two would hold each other's releases).
        yield None
        return
    wrapper = ViewSavepoints(connection)
    with connection.execute_wrapper(wrapper):
        yield wrapper
