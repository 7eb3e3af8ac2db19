"""Refuse an idempotent view's writes to a database other than its record's.

The completion commits with the view's writes only when both are on one database. A
write to another database commits or rolls back on its own: if the view then fails,
the key is released and a retry writes again; if that database's commit fails after
the record completed, every retry replays a result that was never kept. So while a
single-transaction idempotent view runs, every other configured database refuses
statements that write (``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE``, DDL, ...) with
:class:`CrossDatabaseWrite`, before they reach the server. Reads are left alone.

The view does not complete even if it catches the exception: :meth:`WriteGuard.check`
raises it again after the view returns, the view's transaction rolls back and the key
is released, so nothing is stored for an effect that did not happen. Phased views are
not guarded: each phase commits on its own and a write elsewhere is an effect outside
the record's transaction, like a call to another service (docs/phases.md). Databases
listed in ``UNGUARDED_DATABASES`` are not guarded either. See docs/deployment.md.

Detection parses the statement (:func:`writes`): a function that writes, called from a
``SELECT``, is not seen; nor are writes that bypass Django's cursor ``execute`` (psycopg's
``cursor.copy()``), writes from threads the view starts (each has its own
connections), or ``on_commit`` callbacks, which run after the view (docs/deployment.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import sqlparse
from django.db import connections
from sqlparse.tokens import Comment, Keyword, Punctuation

from .conf import conf

logger = logging.getLogger("django_idempotency")

#: Tokens that are not words of the statement.
_SKIP = (
    Comment.Single,
    Comment.Multiline,
    Comment.Single.Hint,
    Comment.Multiline.Hint,
    Punctuation,
)

#: A statement that starts with one of these writes (or may: ``DO``, ``CALL``).
_WRITE_FIRST_WORDS = frozenset(
    {
        "INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT", "TRUNCATE", "CREATE",
        "ALTER", "DROP", "RENAME", "COPY", "GRANT", "REVOKE", "COMMENT", "CALL", "DO",
        "REFRESH", "REINDEX", "CLUSTER", "VACUUM", "IMPORT", "SECURITY", "EXECUTE",
    }
)  # fmt: skip
#: Data-modifying keywords anywhere in a statement (a ``WITH`` part, ``EXPLAIN ANALYZE``).
_WRITE_DML = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT"})
#: Substrings without which no statement can write: most reads skip the parse.
_HINTS = tuple(word.lower() for word in _WRITE_FIRST_WORDS | {"INTO"})


def _text(sql: object, connection: Any = None) -> str:
    """The statement as text: a string, bytes, or a composed psycopg query rendered."""
    if isinstance(sql, str):
        return sql
    if isinstance(sql, (bytes, bytearray, memoryview)):
        return bytes(sql).decode("utf-8", "replace")
    as_string = getattr(sql, "as_string", None)
    if callable(as_string):
        try:
            return str(as_string(connection))
        except Exception:  # no connection to render with: judge the repr
            return str(sql)
    return str(sql)


def _statement_writes(statement: sqlparse.sql.Statement) -> bool:
    tokens = statement.flatten()  # type: ignore[no-untyped-call]
    words = [
        t for t in tokens if not (t.is_whitespace or t.ttype in Comment or t.ttype in Punctuation)
    ]
    if not words:
        return False
    first = words[0].normalized.upper()
    if first in _WRITE_FIRST_WORDS:
        return True
    keywords = [t.normalized.upper() for t in words if t.ttype in Keyword]
    if first == "EXPLAIN":  # only EXPLAIN ANALYZE runs the statement
        analyzed = "ANALYZE" in keywords or "ANALYSE" in keywords
        return analyzed and any(word in _WRITE_DML for word in keywords)
    for index, word in enumerate(keywords):
        before = keywords[index - 1] if index else ""
        if word in _WRITE_DML and not (word == "UPDATE" and before in ("FOR", "KEY")):
            return True  # FOR UPDATE / FOR NO KEY UPDATE only lock rows
        if word in ("CREATE", "DROP", "ALTER", "TRUNCATE"):
            return True
    return first == "SELECT" and "INTO" in keywords  # SELECT ... INTO creates a table


def writes(sql: object, connection: Any = None) -> bool:
    """Whether the statement(s) ``sql`` may write.

    Args:
        sql: a string, bytes, or a composed psycopg query (rendered with
            ``connection``, the driver's connection).
        connection: the DB-API connection, to render a composed query.

    Each statement of a multi-statement string is judged; comments and literals are
    skipped (sqlparse, which Django already depends on). A statement writes when it
    starts with a writing command (``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE``, DDL,
    ``COPY``, ``EXECUTE``, ``CALL``, ``DO``, ...), has a data-modifying part (a ``WITH``
    query, ``EXPLAIN ANALYZE``), or is a ``SELECT ... INTO``. Row locks (``FOR
    UPDATE``) are reads. A function that writes, called from a ``SELECT``, is not seen.
    """
    text = _text(sql, connection)
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS):
        return False
    return any(_statement_writes(statement) for statement in sqlparse.parse(text))


class CrossDatabaseWrite(RuntimeError):
    """An idempotent view wrote to a database other than its record's.

    Raised by the statement itself, which is not sent; the view's transaction rolls
    back and the key is released. Attributes: ``view`` (dotted name), ``endpoint``,
    ``record_database`` and ``database`` (aliases). Fix: keep the record where the view
    writes (the view's ``using=``, the ``DATABASE_RESOLVER`` setting or the router), or
    make the view phased (docs/deployment.md, "Several databases").
    """

    def __init__(
        self, view: str, endpoint: str, record_database: str, database: str, kind: str = "view"
    ) -> None:
        self.view, self.endpoint = view, endpoint
        self.record_database, self.database = record_database, database
        super().__init__(
            f"The idempotent {kind} {view} ({endpoint}) wrote to database {database!r}, but "
            f"its idempotency record is in database {record_database!r}. That write would "
            "commit or roll back apart from the record, so a retry could run it twice or "
            f"replay a result that was never kept: it was refused, and the {kind}'s "
            f"transaction on {record_database!r} rolled back. Keep the record where the "
            f"{kind} writes: using={database!r}, IDEMPOTENCY['DATABASE_RESOLVER'] "
            "or a router sending IdempotencyRecord there (docs/deployment.md); or list "
            f"{database!r} in IDEMPOTENCY['UNGUARDED_DATABASES'] to accept its writes "
            "unprotected."
        )


class WriteGuard:
    """The execute wrapper installed on the other databases while a view runs."""

    def __init__(self, view: str, endpoint: str, record_database: str, kind: str) -> None:
        self.view, self.endpoint, self.record_database = view, endpoint, record_database
        self.kind = kind
        self.refused: CrossDatabaseWrite | None = None

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: Any,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        """Run the statement, unless it writes (then raise :class:`CrossDatabaseWrite`)."""
        if writes(sql, getattr(context["connection"], "connection", None)):
            alias = context["connection"].alias
            error = CrossDatabaseWrite(
                self.view, self.endpoint, self.record_database, alias, self.kind
            )
            if self.refused is None:
                self.refused = error
                logger.error("%s", error, extra={"endpoint": self.endpoint})
            raise error
        return execute(sql, params, many, context)

    def check(self) -> None:
        """Raise the first refusal again (the view may have caught it).

        Raises:
            CrossDatabaseWrite: a write to another database was refused.
        """
        if self.refused is not None:
            raise self.refused


def guarded_aliases(record_database: str) -> list[str]:
    """The configured aliases other than ``record_database`` and the unguarded ones."""
    unguarded = conf.unguarded_databases
    return [a for a in connections if a != record_database and a not in unguarded]


@contextmanager
def guard(
    view: str, endpoint: str, record_database: str, *, kind: str = "view"
) -> Iterator[WriteGuard]:
    """Refuse writes to every other database (this thread's connections) in the block.

    Args:
        view: the view's (or task's, function's) dotted name, for the message.
        endpoint: the record's endpoint (``"POST /v1/orders"``, ``"task:billing.apply"``).
        record_database: the alias holding the record; its statements pass.
        kind: what runs, for the message: ``"view"``, ``"block"``.

    Yields:
        The :class:`WriteGuard`; call its ``check()`` before completing.
    """
    write_guard = WriteGuard(view, endpoint, record_database, kind)
    with ExitStack() as stack:
        for alias in guarded_aliases(record_database):
            stack.enter_context(connections[alias].execute_wrapper(write_guard))
        yield write_guard
