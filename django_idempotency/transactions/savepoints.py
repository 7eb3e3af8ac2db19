"""The view's savepoints in fewer round trips: the first with the ``BEGIN``, releases late.

Inside the app's transaction every ``transaction.atomic()`` block of the view is a
savepoint: ``SAVEPOINT`` when it opens, ``RELEASE SAVEPOINT`` when it closes, a round
trip each, and psycopg's ``BEGIN`` one more before the transaction's first statement.
While a single-transaction view runs on PostgreSQL, :class:`ViewSavepoints` (an execute
wrapper) saves two of them:

- **The first savepoint carries the BEGIN.** When Django's ``SAVEPOINT`` is the
  transaction's first statement (the view opens a block before anything else), it goes
  as ``BEGIN; SAVEPOINT ...`` in one query on psycopg 3's libpq connection, where
  psycopg would send its ``BEGIN`` alone first. psycopg opens a transaction only when
  the server reports none, so it adds no ``BEGIN`` of its own after it; its autocommit
  flag, which Django reads, is never touched. Only where psycopg's ``BEGIN`` would be a
  plain ``BEGIN`` (no isolation level, read-only or deferrable set on the driver's
  connection) and outside pipeline mode. The savepoint is placed when Django asks for
  it, as before: only the ``BEGIN`` moved.
- **Releases are held back.** A release changes nothing the next statement could
  observe: it only merges the savepoint's work into its parent. So each release is held
  and sent just before the next statement, in order; the ones still held when the view
  is done are dropped, because the transaction ends next (its ``COMMIT`` or
  ``ROLLBACK`` releases every savepoint). A view whose last block closes right before it
  returns (the common shape) saves that round trip.

What is held, and when:

- only Django's own statement (``RELEASE SAVEPOINT "s<thread>_x<n>"``), never SQL of
  the view's own, and only for a savepoint the wrapper saw placed and still standing:
  the release of one a rollback destroyed fails where it is made. SQL of the view's own
  that may release or roll back savepoints ends that knowledge for those placed before;
- only while the transaction is healthy (PostgreSQL's ``INTRANS``): in an aborted
  transaction Django's release fails and Django handles that failure where it happens;
- only while Django is not logging queries and no wrapper of the view's own sits inside
  this one: ``DEBUG``, ``assertNumQueries``, ``CaptureQueriesContext`` and the view's
  wrappers see each statement as Django makes it (the first savepoint, too, then goes
  after psycopg's own ``BEGIN``). Held releases go out through the driver's connection,
  past the wrappers and the log, which saw them when made (one per query in psycopg's
  pipeline mode).

When a statement that bypasses Django's execute wrappers (psycopg's ``cursor.copy()``)
aborted the transaction, or the connection was closed, held releases are dropped
instead of sent: the aborted transaction can only go on by rolling back to a savepoint
opened before them, which removes theirs as their release would have, and a closed
connection fails the next statement as Django makes it fail. Only one wrapper is active
per connection: an idempotent view called inside another one's transaction leaves its
statements to the outer one's. Savepoint SQL the view sends through the driver's
connection itself is not seen (docs/storage.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

#: Django's savepoint statements (``ops.savepoint_create_sql`` and its siblings) on the
#: ids ``connection.savepoint()`` makes: ``RELEASE SAVEPOINT "s140_x1"``. A statement
#: of the view's own that starts the same way is not one of them.
_SAVEPOINT = "SAVEPOINT"
_RELEASE = "RELEASE SAVEPOINT"
_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT"
#: Words of SQL that may release or roll back a savepoint, or end the transaction (in
#: any case; a false alarm only stops the holding of releases of the savepoints placed
#: before that statement).
_ENDS_SAVEPOINTS = re.compile(r"\b(?:savepoint|release|rollback|commit|abort|end|prepare)\b", re.I)
_DJANGO_SAVEPOINT = re.compile(
    rf'(?P<verb>{_SAVEPOINT}|{_RELEASE}|{_ROLLBACK_TO}) (?P<name>"s\d+_x\d+")'
)
#: libpq's ``PQTRANS_IDLE`` (no transaction open), ``PQTRANS_INTRANS`` (idle inside a
#: healthy transaction block) and ``PQTRANS_INERROR`` (inside a transaction a failed
#: statement aborted).
_IDLE = 0
_INTRANS = 2
_INERROR = 3


class ViewSavepoints:
    """An execute wrapper (``connection.execute_wrapper``) for the view's savepoints.

    It sends a first ``SAVEPOINT`` with the transaction's ``BEGIN`` and holds releases
    back (the module's docstring says when).

    Args:
        connection: the Django connection it wraps (PostgreSQL).

    Attributes:
        held: the ``RELEASE SAVEPOINT`` statements held back, in order.
        placed: the quoted names of the savepoints this wrapper saw created that still
            stand, outermost first (a rollback to one destroys those after it).
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.held: list[str] = []
        self.placed: list[str] = []

    def __call__(
        self, execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Hold a release back; send the held ones before any other statement.

        Django's ``SAVEPOINT`` that would be the transaction's first statement goes with
        the transaction's ``BEGIN``.
        """
        ours = None
        if params is None and not many and isinstance(sql, str):
            ours = _DJANGO_SAVEPOINT.fullmatch(sql)  # never a statement of the view's own
        if ours is not None and ours["verb"] == _RELEASE and self._holds(ours["name"]):
            del self.placed[self.placed.index(ours["name"]) :]
            self.held.append(sql)
            return None
        self.flush()
        if ours is None and (not isinstance(sql, str) or _ENDS_SAVEPOINTS.search(sql)):
            # SQL of the view's own that may release or roll back savepoints (or end the
            # transaction): those placed so far are no longer known to stand, and their
            # releases go out as Django makes them, to fail where they would.
            self.placed = []
        result = None
        if ours is not None and ours["verb"] == _SAVEPOINT and self._opens_transaction():
            self._begin_with(sql)
        else:
            result = execute(sql, params, many, context)
        if ours is not None:
            self._track(ours["verb"], ours["name"])
        return result

    def _opens_transaction(self) -> bool:
        """Whether Django's savepoint may carry the transaction's ``BEGIN``.

        No transaction is open on the server yet, psycopg 3 would open one with a plain
        ``BEGIN`` (outside pipeline mode), and nothing watches the statements one by one.
        """
        raw = self.connection.connection
        pgconn = getattr(raw, "pgconn", None)  # psycopg 3 only
        return (
            pgconn is not None
            and self._status() == _IDLE
            and raw.autocommit is False
            and raw.isolation_level is None
            and raw.read_only is None
            and raw.deferrable is None
            and not pgconn.pipeline_status
            and self._unwatched()
        )

    def _begin_with(self, sql: str) -> None:
        """Send ``BEGIN; <sql>`` as one query on the driver's libpq connection.

        Raises:
            django.db.DatabaseError: the server refused it (a transaction it opened
                stays open and aborted, and Django's block rolls it back).
        """
        from psycopg import errors, pq

        raw = self.connection.connection
        with self.connection.wrap_database_errors:
            result = raw.pgconn.exec_(f"BEGIN; {sql}".encode(raw.info.encoding))
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise errors.error_from_result(result, encoding=raw.info.encoding)

    def _holds(self, name: str) -> bool:
        """Whether the release of savepoint ``name`` can wait for the next statement."""
        return (
            name in self.placed  # a release of one destroyed meanwhile fails at once
            and self._status() == _INTRANS
            and self._unwatched()
        )

    def _unwatched(self) -> bool:
        """Whether nothing sees Django's statements one by one as they are made.

        Django's query log shows what is sent, as sent; a wrapper of the view's own,
        inside this one, sees each statement as it comes.
        """
        return not self.connection.queries_logged and self.connection.execute_wrappers[-1] is self

    def _track(self, verb: str, name: str) -> None:
        """Follow the savepoints that stand after Django's statement ``verb`` succeeded."""
        if verb == _SAVEPOINT:
            self.placed.append(name)
        elif name in self.placed:  # a release or a rollback destroys those after it
            del self.placed[self.placed.index(name) + (verb == _ROLLBACK_TO) :]

    def _status(self) -> int | None:
        info = getattr(self.connection.connection, "info", None)
        status = getattr(info, "transaction_status", None)
        return None if status is None else int(status)

    def flush(self) -> None:
        """Send the held releases now, in the order Django asked for them.

        They go through the driver's connection, past Django's execute wrappers and
        query log: those saw each release when Django made it. In a transaction that a
        statement past the wrappers aborted meanwhile, they are dropped instead: sent,
        they would fail, where the rollback to an earlier savepoint that must come next
        removes their savepoints anyway.

        Raises:
            django.db.DatabaseError: the database failed.
        """
        if not self.held:
            return
        if self._status() != _INTRANS:
            # Aborted by a statement past the wrappers (or the connection closed, or
            # the transaction ended past them): sent, they would fail, where the
            # rollback to an earlier savepoint that must come next removes their
            # savepoints anyway, and a closed connection fails the next statement.
            self.held = []
            return
        statements, self.held = self.held, []
        raw = self.connection.connection
        # psycopg's pipeline mode takes one statement per query.
        pipelined = getattr(getattr(raw, "pgconn", None), "pipeline_status", 0)
        with self.connection.wrap_database_errors, raw.cursor() as cursor:
            for query in statements if pipelined else ["; ".join(statements)]:
                cursor.execute(query)

    def drop(self) -> None:
        """Forget the held releases: the transaction ends next and releases them."""
        self.held = []


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
    # Not ``connection.execute_wrapper()``: its exit removes the last wrapper, which is
    # the view's own if the view left one installed.
    connection.execute_wrappers.append(wrapper)
    try:
        yield wrapper
    finally:
        wrapper.drop()
        for index in range(len(connection.execute_wrappers) - 1, -1, -1):
            if connection.execute_wrappers[index] is wrapper:
                del connection.execute_wrappers[index]
                break
