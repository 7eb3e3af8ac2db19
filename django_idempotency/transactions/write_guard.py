"""Refuse an idempotent view's writes to a database other than its record's.

The completion commits with the view's writes only when both are on one database. A
write to another database commits or rolls back on its own: if the view then fails,
the key is released and a retry writes again; if that database's commit fails after
the record completed, every retry replays a result that was never kept. So while a
single-transaction idempotent view runs, every other configured database refuses
statements that write (``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE``, DDL, ``NOTIFY``,
...) with :class:`CrossDatabaseWrite`, before they reach the server. Reads are left
alone, whatever words they use: a statement is judged by its kind (:func:`writes`).

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
from sqlparse.tokens import Comment, Literal, Number

from django_idempotency.conf import conf
from django_idempotency.exceptions import CrossDatabaseWrite

logger = logging.getLogger("django_idempotency")

#: Commands that write, or may (``DO``, ``CALL``, ``EXECUTE``: code the guard cannot
#: see). ``NOTIFY`` is delivered when that database's transaction commits, apart from
#: the record, like a row written there: a retry after a failure would notify again.
_WRITE_COMMANDS = frozenset(
    {
        "INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT", "TRUNCATE", "CREATE",
        "ALTER", "DROP", "RENAME", "COPY", "GRANT", "REVOKE", "COMMENT", "CALL", "DO",
        "REFRESH", "REINDEX", "CLUSTER", "VACUUM", "IMPORT", "SECURITY", "EXECUTE",
        "NOTIFY", "REASSIGN", "LOAD",
    }
)  # fmt: skip
#: The statements a ``WITH`` query, ``EXPLAIN`` or ``PREPARE`` may carry.
_STATEMENT_STARTS = frozenset(
    {
        "SELECT", "VALUES", "TABLE", "WITH", "INSERT", "UPDATE", "DELETE", "MERGE",
        "REPLACE", "UPSERT", "EXECUTE", "CREATE", "DECLARE",
    }
)  # fmt: skip
#: The words of ``BEGIN`` as transaction control (PostgreSQL, SQLite, MySQL); with any
#: other word it opens a block of procedural code (Oracle's anonymous ``BEGIN ... END``).
_BEGIN_WORDS = frozenset(
    {
        "TRANSACTION", "WORK", "ISOLATION", "LEVEL", "SERIALIZABLE", "REPEATABLE", "READ",
        "COMMITTED", "UNCOMMITTED", "WRITE", "ONLY", "NOT", "DEFERRABLE", "DEFERRED",
        "IMMEDIATE", "EXCLUSIVE", ",", ";",
    }
)  # fmt: skip
#: Substrings without which no statement can write: most reads skip the parse.
_HINTS = tuple(word.lower() for word in _WRITE_COMMANDS | {"INTO"})
#: What a literal (a string, a dollar-quoted body) is reduced to: never a word. A number
#: keeps its digits after it (``'0``), for ``EXPLAIN (ANALYZE 0)``.
_LITERAL = "'"
#: ``EXPLAIN (ANALYZE <this>)`` does not run the statement.
_FALSE = frozenset({"FALSE", "OFF", _LITERAL + "0"})


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


def _words(statement: sqlparse.sql.Statement) -> list[str]:
    """The statement's tokens as upper-case words and punctuation, without comments.

    Literals start with :data:`_LITERAL` (``'insert'`` is no keyword); quoted identifiers
    keep their quotes (``"merge"`` is no keyword either).
    """
    words = []
    for token in statement.flatten():  # type: ignore[no-untyped-call]
        if token.is_whitespace or token.ttype in Comment:
            continue
        if token.ttype in Number:
            words.append(_LITERAL + token.value)
        elif token.ttype in Literal:
            words.append(_LITERAL)
        else:
            words.append(token.normalized.upper())
    return words


def _close(words: list[str], start: int) -> int:
    """The index of the ``)`` closing the ``(`` at ``start`` (``len(words)`` if none)."""
    depth = 0
    for index in range(start, len(words)):
        if words[index] == "(":
            depth += 1
        elif words[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return len(words)


def _kind_writes(words: list[str]) -> bool:
    """Whether the statement ``words`` writes, judged by its kind.

    Its kind is its first word (after opening parentheses); a keyword elsewhere (a
    function ``replace()``, an alias ``AS merge``, ``FOR UPDATE``) decides nothing. A
    ``WITH`` query writes when one of its parts or its main statement does,
    ``EXPLAIN`` when it analyses a statement that writes, ``PREPARE`` when its
    statement does, and a ``SELECT`` when it has ``INTO`` (it creates a table). A block
    of procedural code (``BEGIN ... END``, ``DECLARE ... BEGIN``) writes, like ``DO``.
    """
    start = 0
    while start < len(words) and words[start] == "(":
        start += 1
    if start == len(words):
        return False
    first, rest = words[start], words[start + 1 :]
    if first in _WRITE_COMMANDS:
        return True
    if first == "WITH":
        return _with_writes(rest)
    if first == "EXPLAIN":
        return _explain_writes(rest)
    if first == "PREPARE":  # PREPARE name [(types)] AS statement (not PREPARE TRANSACTION)
        return "AS" in rest and _kind_writes(rest[rest.index("AS") + 1 :])
    if first == "DECLARE":  # DECLARE name ... CURSOR ... FOR query
        if "CURSOR" not in rest:
            return True  # a block of procedural code (DECLARE ... BEGIN ... END), like DO
        after = rest[rest.index("CURSOR") + 1 :]
        return "FOR" in after and _kind_writes(after[after.index("FOR") + 1 :])
    if first == "BEGIN":  # transaction control, or a block of procedural code, like DO
        return not all(part in _BEGIN_WORDS for word in rest for part in word.split())
    if first in ("SELECT", "VALUES", "TABLE"):
        return "INTO" in rest  # SELECT ... INTO creates a table; INTO is reserved
    return False


def _with_writes(words: list[str]) -> bool:
    """Whether ``WITH <words>`` writes: a data-modifying part, or its main statement.

    ``[RECURSIVE] name [(columns)] AS [NOT] [MATERIALIZED] (query) [SEARCH ...]
    [CYCLE ...] [, ...] statement`` (PostgreSQL's grammar, which SQLite's and MySQL's
    are parts of). A list the walk does not follow counts as a write: the server would
    refuse it anyway.
    """
    index = 1 if words[:1] == ["RECURSIVE"] else 0
    while True:
        index += 1  # the part's name
        if words[index : index + 1] == ["("]:
            index = _close(words, index) + 1  # its column names
        if words[index : index + 1] != ["AS"]:
            return True
        index += 1
        if words[index : index + 1] == ["NOT"]:
            index += 1
        if words[index : index + 1] == ["MATERIALIZED"]:
            index += 1
        if words[index : index + 1] != ["("]:
            return True
        end = _close(words, index)
        if _kind_writes(words[index + 1 : end]):
            return True
        index = end + 1
        while words[index : index + 1] in (["SEARCH"], ["CYCLE"]):
            # SEARCH ... BY columns SET name / CYCLE columns SET name [TO v DEFAULT v]
            # USING name: no statement in them, and commas of their own.
            if "SET" not in words[index:]:
                return True
            index = words.index("SET", index) + 2
            if words[index : index + 1] == ["TO"]:
                index += 4
            if words[index : index + 1] == ["USING"]:
                index += 2
        if words[index : index + 1] != [","]:
            return _kind_writes(words[index:])


def _explain_writes(words: list[str]) -> bool:
    """Whether ``EXPLAIN <words>`` writes: only ``ANALYZE`` runs the statement."""
    start = next((i for i, word in enumerate(words) if word in _STATEMENT_STARTS), len(words))
    options = words[:start]
    analyzed = any(
        word in ("ANALYZE", "ANALYSE") and (options[i + 1 : i + 2] or [""])[0] not in _FALSE
        for i, word in enumerate(options)
    )
    return analyzed and _kind_writes(words[start:])


def _nested_comments_removed(text: str) -> str | None:
    """``text`` as PostgreSQL reads it where a block comment nests; ``None``: none does.

    PostgreSQL nests ``/* */`` comments (``/* a /* b */ c */`` is one comment); sqlparse,
    like SQLite and MySQL, ends a comment at its first ``*/``. Comments are found by
    sqlparse's lexer, so ``/*`` inside a literal opens none.
    """
    parts: list[str] = []
    rest = text
    while True:
        offset = 0
        for ttype, value in sqlparse.lexer.tokenize(rest):  # type: ignore[no-untyped-call]
            depth = value.count("/*") - value.count("*/") if ttype in Comment.Multiline else 0
            if depth > 0:
                index = offset + len(value)
                while depth and index < len(rest):
                    if rest.startswith("/*", index):
                        depth, index = depth + 1, index + 2
                    elif rest.startswith("*/", index):
                        depth, index = depth - 1, index + 2
                    else:
                        index += 1
                parts.append(rest[:offset] + " ")
                rest = rest[index:]
                break
            offset += len(value)
        else:
            return "".join(parts) + rest if parts else None


def writes(sql: object, connection: Any = None) -> bool:
    """Whether the statement(s) ``sql`` may write.

    Args:
        sql: a string, bytes, or a composed psycopg query (rendered with
            ``connection``, the driver's connection).
        connection: the DB-API connection, to render a composed query.

    Each statement of a multi-statement string is judged by its kind, its first
    keyword after comments and opening parentheses; comments and literals are skipped
    (sqlparse, which Django already depends on). A statement writes when it is a
    writing command (``INSERT``, ``UPDATE``, ``DELETE``, ``MERGE``, DDL, ``COPY``,
    ``EXECUTE``, ``CALL``, ``DO``, ``NOTIFY``, ...), a ``WITH`` query with a
    data-modifying part or main statement, ``EXPLAIN ANALYZE`` of a statement that
    writes, or a ``SELECT ... INTO``. A keyword anywhere else decides nothing: a
    function named ``replace``, an alias ``merge``, a row lock (``FOR UPDATE``) are
    parts of a read. A function that writes, called from a ``SELECT``, is not seen.

    Where a block comment nests, the statement is judged both as PostgreSQL reads it
    (nested) and as SQLite and MySQL do (ended at the first ``*/``): it writes if either
    reading does.
    """
    text = _text(sql, connection)
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS):
        return False
    texts = [text]
    if "/*" in text:
        nested = _nested_comments_removed(text)
        if nested is not None:
            texts.append(nested)
    return any(
        _kind_writes(piece)
        for each in texts
        for statement in sqlparse.parse(each)
        for piece in _pieces(_words(statement))
    )


def _pieces(words: list[str]) -> Iterator[list[str]]:
    """``words`` split at each ``;``, each piece a statement of its own.

    sqlparse keeps what follows ``BEGIN ...;`` in one statement (a block, to it), where
    the server may run several statements.
    """
    start = 0
    for index, word in enumerate(words):
        if word == ";":
            yield words[start:index]
            start = index + 1
    yield words[start:]


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
