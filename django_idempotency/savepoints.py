"""The view's ``RELEASE SAVEPOINT`` statements, sent late or not at all.

Inside the app's transaction every ``transaction.atomic()`` block of the view is a
savepoint: ``SAVEPOINT`` when it opens, ``RELEASE SAVEPOINT`` when it closes, a round
trip each. A release changes nothing the next statement could observe: it only merges
the savepoint's work into its parent. So while a single-transaction view runs on
PostgreSQL, :class:`DeferredReleases` holds each release back and sends it just before
the next statement, in order; and the releases still held when the view is done are
dropped, because the transaction ends next (its ``COMMIT`` or ``ROLLBACK`` releases every
savepoint). A view whose last block closes right before it returns (the common shape)
then saves that round trip.

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

#: Django's release statement: ``RELEASE SAVEPOINT "s140_x1"`` (``ops.savepoint_commit_sql``).
_RELEASE = "RELEASE SAVEPOINT "
#: libpq's ``PQTRANS_INTRANS``: idle inside a healthy transaction block.
_INTRANS = 2


class DeferredReleases:
    """An execute wrapper (``connection.execute_wrapper``) that holds releases back.

    Args:
        connection: the Django connection it wraps (PostgreSQL).
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.held: list[str] = []
        self._flushing = False

    def __call__(
        self, execute: Any, sql: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Hold a release back; send the held ones before any other statement."""
        if self._flushing:
            return execute(sql, params, many, context)
        if (
            params is None
            and not many
            and isinstance(sql, str)
            and sql.startswith(_RELEASE)
            and self._healthy()
        ):
            self.held.append(sql)
            return None
        self.flush()
        return execute(sql, params, many, context)

    def _healthy(self) -> bool:
        info = getattr(self.connection.connection, "info", None)
        status = getattr(info, "transaction_status", None)
        return status is not None and int(status) == _INTRANS

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


@contextmanager
def deferred_releases(using: str) -> Iterator[DeferredReleases | None]:
    """Hold the view's releases back on ``using`` while the block runs (PostgreSQL).

    Yields the wrapper, or ``None`` on other databases (nothing is held). The caller
    calls :meth:`DeferredReleases.drop` right before the statement that ends the
    transaction; held releases otherwise go out before the next statement.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield None
        return
    wrapper = DeferredReleases(connection)
    with connection.execute_wrapper(wrapper):
        yield wrapper
