"""The view's savepoints inside the app's transaction, in fewer round trips.

Inside the app's transaction every ``transaction.atomic()`` block of the view is a
savepoint: ``SAVEPOINT`` when it opens, ``RELEASE SAVEPOINT`` when it closes, a round
trip each, and the transaction's ``BEGIN`` one more before the first. While a
single-transaction view runs on PostgreSQL, :class:`ViewSavepoints` (an execute
wrapper) saves two of them:

* **The first savepoint goes with the BEGIN.** When the view's first statement in the
  transaction is a ``SAVEPOINT`` (its block opens before anything else ran), the
  wrapper sends ``BEGIN; SAVEPOINT ...`` in one simple query instead of letting psycopg
  send its ``BEGIN`` alone first. psycopg is switched to autocommit for that (public
  API, allowed while no transaction is open) so that it adds no ``BEGIN`` of its own;
  the transaction is then the explicit one it carries, which psycopg passes through,
  and Django's exit of the app's block commits or rolls it back and restores
  autocommit as always. Only with psycopg's default transaction characteristics
  (isolation level, read-only and deferrable unset, so its ``BEGIN`` is a plain
  ``BEGIN``) and where the app's block is the whole transaction.
* **Releases are held back.** A release changes nothing the next statement could
  observe: it only merges the savepoint's work into its parent. So each release is
  held and sent just before the next statement, in order; the ones still held when the
  view is done are dropped, because the transaction ends next (its ``COMMIT`` or
  ``ROLLBACK`` releases every savepoint). A view whose last block closes right before it
  returns (the common shape) saves that round trip. While Django logs queries
  (``DEBUG``, ``assertNumQueries``, ``CaptureQueriesContext``) nothing is held, so the
  log lists exactly the statements sent.

A release is held only while the transaction is healthy (PostgreSQL's ``INTRANS``): in
a transaction a failed statement aborted, Django's release fails and Django handles
that failure where it happens, so it is sent at once. Statements that bypass Django's
execute wrappers (psycopg's ``cursor.copy()``, the raw driver connection) run inside the
savepoint not yet released, which is the same transaction state; only a raw
``ROLLBACK TO SAVEPOINT`` of an outer savepoint, sent past Django, would make the held
release fail, on the next statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

#: Django's statements (``ops.savepoint_create_sql`` / ``savepoint_commit_sql``):
#: ``SAVEPOINT "s140_x1"``, ``RELEASE SAVEPOINT "s140_x1"``.
_SAVEPOINT = "SAVEPOINT "
_RELEASE = "RELEASE SAVEPOINT "
#: libpq's ``PQTRANS_IDLE`` (no transaction open) and ``PQTRANS_INTRANS`` (idle inside
#: a healthy transaction block).
_IDLE = 0
_INTRANS = 2


class ViewSavepoints:
    """An execute wrapper (``connection.execute_wrapper``) for the view's savepoints.

    Args:
        connection: the Django connection it wraps (PostgreSQL).
        begin: whether the view's first ``SAVEPOINT`` may carry the transaction's
            ``BEGIN`` (the caller's block is the whole transaction).
    """

    def __init__(self, connection: Any, *, begin: bool = False) -> None:
        self.connection = connection
        self.held: list[str] = []
        self.begin = begin
        self._flushing = False

    def __call__(
        self, execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Send the first savepoint with the BEGIN, and hold releases back.

        Held releases go out, in order, before the next statement of any other kind.
        """
        if self._flushing:
            return execute(sql, params, many, context)
        plain = params is None and not many and isinstance(sql, str)
        if (
            plain
            and sql.startswith(_RELEASE)
            and self._status() == _INTRANS
            and not self.connection.queries_logged  # the log shows what is sent, as sent
        ):
            self.held.append(sql)
            return None
        self.flush()
        if plain and self.begin and sql.startswith(_SAVEPOINT):
            self.begin = False  # the first statement only
            raw = self.connection.connection
            if self._status() == _IDLE and _plain_begin(raw):
                return self._begin_with(execute, sql, context, raw)
        self.begin = False
        return execute(sql, params, many, context)

    def _begin_with(self, execute: Any, sql: str, context: dict[str, Any], raw: Any) -> Any:
        raw.autocommit = True  # psycopg adds no BEGIN: ours opens the transaction
        try:
            return execute(f"BEGIN; {sql}", None, False, context)
        except BaseException:
            if self._status() == _IDLE:  # no transaction was opened: psycopg opens them
                raw.autocommit = False
            raise

    def _status(self) -> int | None:
        info = getattr(self.connection.connection, "info", None)
        status = getattr(info, "transaction_status", None)
        return None if status is None else int(status)

    def flush(self) -> None:
        """Send the held releases now, in the order Django asked for them."""
        if not self.held:
            return
        statements, self.held = "; ".join(self.held), []
        self._flushing = True
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(statements)
        finally:
            self._flushing = False

    def drop(self) -> None:
        """Forget the held releases: the transaction ends next and releases them."""
        self.held = []


def _plain_begin(raw: Any) -> bool:
    """Whether psycopg 3 would open a transaction on ``raw`` with a plain ``BEGIN``."""
    return (
        getattr(raw, "autocommit", None) is False
        and getattr(raw, "isolation_level", 0) is None
        and getattr(raw, "read_only", 0) is None
        and getattr(raw, "deferrable", 0) is None
    )


@contextmanager
def view_savepoints(using: str, *, begin: bool = False) -> Iterator[ViewSavepoints | None]:
    """Wrap the view's statements on ``using`` while the block runs (PostgreSQL).

    Args:
        using: the database alias of the app's transaction.
        begin: the app's block is the whole transaction and no statement ran in it
            yet: the view's first savepoint may carry its ``BEGIN``.

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
    wrapper = ViewSavepoints(connection, begin=begin)
    with connection.execute_wrapper(wrapper):
        yield wrapper
