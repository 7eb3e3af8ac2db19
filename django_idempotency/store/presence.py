"""Owner presence on PostgreSQL: a lock the owner's session holds while it executes.

The rule (docs/robustness.md#owner-presence): a claim made on a direct connection
takes a session-level advisory lock keyed by the record's scope, in the claim's own
statement, and records the session's backend pid in ``owner_pid``. The lock is
released in the statement that completes or releases the claim. PostgreSQL releases
it by itself when the session ends, so a duplicate that finds the record claimed with
a live lease, ``owner_pid`` set and the lock free knows the owner is gone (its claim
statement reports it: ``sql.owner_gone``) and takes the claim over at once, with one
conditional statement fenced by the owner token it read. A live owner holds
the lock however slow it is (stopped, paused, waiting on a downstream call), so it is
never taken over early: the lease decides, as without presence.

Behind a transaction pooler a client's statements run on whichever server session is
free, so a session lock would stay behind on one of them: the owner then takes no lock
(``owner_pid`` stays ``NULL``) and the lease alone decides. Whether a connection is
direct is the ``OWNER_PRESENCE`` setting: ``"auto"`` (default), ``True`` or ``False``
(:func:`takes`).

A connection holds presence locks only for the claims in flight on it: each request,
``inbox.once`` block and Celery task body runs as an :func:`entry_point`, and when the
outermost one ends, a lock still held for a claim made in it (a failure between the
claim and its settling statement) is released and logged (:func:`release_leftovers`),
so locks never pile up on a persistent connection in PostgreSQL's shared lock table.

This module also holds the waiting duplicates' side (:func:`wait_for_owner`): with
``wait=`` > 0 a duplicate queues for the owner's lock (bounded by ``lock_timeout``)
instead of polling, and is woken when the owner completes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, OperationalError, connections, transaction
from django.utils.connection import ConnectionDoesNotExist

from django_idempotency.conf import conf
from django_idempotency.logs import key_hash, scope_fields
from django_idempotency.store import sql
from django_idempotency.store.catalog import server_port
from django_idempotency.store.values import Claim, Scope

logger = logging.getLogger("django_idempotency")

#: SQLSTATE of lock_not_available: a ``lock_timeout`` ran out.
_LOCK_NOT_AVAILABLE = "55P03"
#: PostgreSQL's default port, when a database's ``PORT`` is empty.
_DEFAULT_PORT = 5432


def direct(connection: Any) -> bool:
    """Whether ``connection`` looks like a direct session with the PostgreSQL server.

    ``False`` when ``DISABLE_SERVER_SIDE_CURSORS`` is set (Django's documented setting
    for transaction poolers) or when the port the client connects to differs from the
    port the server says it listens on (a pooler or proxy in between). A pooler on the
    server's own port cannot be told apart: set ``OWNER_PRESENCE = False`` there.
    """
    settings = connection.settings_dict
    if settings.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    try:
        client_port = int(settings.get("PORT") or _DEFAULT_PORT)
    except ValueError:
        return False
    return server_port(connection) == client_port


def takes(connection: Any) -> bool:
    """Whether a claim on ``connection`` takes the presence lock now.

    PostgreSQL only, outside a caller's transaction (an atomic block or manual
    transactions: a claim that cannot commit on its own is not visible to duplicates
    anyway, and a rollback of that transaction would leave the lock held), and per
    ``OWNER_PRESENCE``: ``True`` always, ``False`` never, ``"auto"`` when
    :func:`direct`.
    """
    mode = conf.owner_presence
    if connection.vendor != "postgresql" or mode is False:
        return False
    if connection.in_atomic_block or not connection.get_autocommit():
        return False  # the claim joins a caller's transaction (atomic or manual)
    return mode is True or direct(connection)


def tests(connection: Any) -> bool:
    """Whether a claim on ``connection`` may take over a record whose owner is gone.

    Always on PostgreSQL unless ``OWNER_PRESENCE`` is ``False``: the test reads a lock
    the *owner's* session took on a direct connection, which is right from any
    session, pooled ones included (a transaction-level probe, gone with the statement).
    """
    return connection.vendor == "postgresql" and conf.owner_presence is not False


@dataclass(frozen=True)
class _Hold:
    """A presence lock held.

    The claim, the DB-API connection whose session holds the lock, and the outermost
    entry point (:func:`entry_point`) it was taken in, if any.
    """

    claim: Claim
    raw: Callable[[], Any]  # a weak reference: a closed, collected connection holds nothing
    entry: object | None


# The claims whose presence lock is held, by owner token (a reconnected wrapper's new
# session holds nothing: the lock belongs to the DB-API connection of the claim).
_held: dict[uuid.UUID, _Hold] = {}
_held_lock = threading.Lock()
#: The outermost entry point running in this thread or task (a marker), if any.
_entry: ContextVar[object | None] = ContextVar("django_idempotency_entry_point", default=None)


def _ref(raw: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(raw)
    except TypeError:
        return lambda: raw


def hold(claim: Claim) -> None:
    """Note that ``claim``'s session holds its presence lock."""
    raw = connections[claim.using].connection
    with _held_lock:
        _held[claim.owner_token] = _Hold(claim, _ref(raw), _entry.get())


def dropped(claim: Claim) -> None:
    """Note that ``claim``'s presence lock was released (by a statement that did it)."""
    with _held_lock:
        _held.pop(claim.owner_token, None)


def holds(claim: Claim) -> bool:
    """Whether ``claim``'s presence lock is still held, as far as this process knows."""
    with _held_lock:
        return claim.owner_token in _held


def unlock(using: str, scope: Scope) -> bool:
    """Release the presence lock of ``scope`` held by this thread's session (best effort).

    Returns:
        Whether the statement was sent: not on a closed connection (its session, and
        the lock, are gone) nor in a transaction that can no longer run statements.
    """
    connection = connections[using]
    if connection.connection is None or (
        connection.in_atomic_block and transaction.get_rollback(using)
    ):
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql.PG_UNLOCK_SQL, _params(scope))
    except DatabaseError:
        return False
    return True


def ensure_released(claim: Claim) -> None:
    """Release ``claim``'s presence lock if no statement did (a path that failed).

    The completing and releasing statements release it themselves; this costs a round
    trip only when neither ran (a suspended phased claim, a store failure). A session
    that was replaced since (reconnected) held nothing to release.
    """
    with _held_lock:
        held = _held.pop(claim.owner_token, None)
    if held is None:
        return
    connection = connections[claim.using]
    raw = held.raw()
    if raw is None or connection.connection is not raw:
        return
    unlock(claim.using, claim.scope)


def _gone(raw: Any) -> bool:
    """Whether the DB-API connection ``raw`` was collected or closed (its session ended)."""
    return raw is None or bool(getattr(raw, "closed", False))


def release_leftovers(entry: object, what: str) -> list[Claim]:
    """Release the presence locks still held for claims made in the entry point ``entry``.

    Called when the outermost :func:`entry_point` of a thread or task ends: by then every
    claim made in it was completed, released or suspended, each releasing its lock, so a
    lock still held is left over (a failure between a claim and its settling statement)
    and would otherwise stay with a persistent connection (``CONN_MAX_AGE``, a Celery
    worker) for the life of the process, filling PostgreSQL's shared lock table (sized
    ``max_locks_per_transaction`` x ``max_connections``) for every application on the
    server. Each one released is logged at WARNING on the ``django_idempotency`` logger.
    Locks of sessions that ended (closed connections) are forgotten; claims made with
    the store's functions outside any entry point are left to their caller.

    Args:
        entry: the marker of the entry point that ends.
        what: what ended, for the log line (``"request"``, ``"once() block"``).

    Returns:
        The claims whose lock was released here.
    """
    if not _held:  # the common case: every claim released its own
        return []
    mine: list[Claim] = []
    with _held_lock:
        for token, held in list(_held.items()):
            raw = held.raw()
            if _gone(raw):
                del _held[token]
            elif held.entry is entry:
                del _held[token]
                if _connection_of(held.claim.using) is raw:  # else a session replaced since
                    mine.append(held.claim)
    released: list[Claim] = []
    for claim in mine:
        extra = scope_fields(claim.scope)
        if not unlock(claim.using, claim.scope):  # a doomed transaction refuses statements
            logger.error(
                "the presence lock of a claim was still held when its %s ended and could "
                "not be released (endpoint %s, key hash %s): it goes when the connection "
                "closes",
                what,
                claim.scope.endpoint,
                key_hash(claim.scope.key),
                extra=extra,
            )
            continue
        released.append(claim)
        logger.warning(
            "the presence lock of a claim was still held when its %s ended: released, so "
            "this connection holds locks only for claims in flight (endpoint %s, key "
            "hash %s). Every claim is settled (completed, released or suspended) before "
            "the request, task or once() block that made it ends: please report this.",
            what,
            claim.scope.endpoint,
            key_hash(claim.scope.key),
            extra=extra,
        )
    return released


def _connection_of(using: str) -> Any:
    """The DB-API connection of alias ``using`` in this thread (``None``: not connected)."""
    try:
        return connections[using].connection
    except ConnectionDoesNotExist:  # an alias made at run time, removed since
        return None


@contextmanager
def entry_point(what: str) -> Iterator[None]:
    """The block of an entry point: a view's request, an ``inbox.once`` block, a task.

    When the outermost entry point of this thread or task ends, the presence locks still
    held for claims made in it are released (:func:`release_leftovers`): a connection
    holds presence locks only for claims in flight on it, whatever failed on the way.

    Args:
        what: what the block is, for the log line (``"request"``, ``"once() block"``).
    """
    if _entry.get() is not None:  # inside another entry point: the outermost one sweeps
        yield
        return
    entry = object()
    token = _entry.set(entry)
    try:
        yield
    finally:
        _entry.reset(token)
        release_leftovers(entry, what)


def _params(scope: Scope) -> dict[str, str]:
    return {"principal": scope.principal, "endpoint": scope.endpoint, "key": scope.key}


class _Waiters:
    """Per-process count of duplicates waiting on a presence lock (``MAX_WAITERS``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def enter(self) -> bool:
        with self._lock:
            if self.count >= conf.max_waiters:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


waiters = _Waiters()


class WaitersFull(Exception):
    """``MAX_WAITERS`` duplicates of this process already wait: answer 409 at once."""


def can_wait(using: str) -> bool:
    """Whether a duplicate on ``using`` waits on the owner's lock rather than polling.

    Only on a direct PostgreSQL connection (:func:`takes`): a waiter holds a server
    session for as long as it waits, which behind a pooler would take the pool's.
    """
    return takes(connections[using])


def wait_for_owner(using: str, scope: Scope, seconds: float) -> bool:
    """Wait up to ``seconds`` for the owner of ``scope`` to finish; whether it did.

    Queues for the presence lock in shared mode (every waiter wakes together) with
    ``lock_timeout``; once granted (the owner's completion or release released it, or
    its session died), waits for the row lock of the owner's completion, i.e. until its
    transaction ends. Returns ``True`` when woken that way, ``False`` when
    ``seconds`` ran out (the caller claims again and answers 409 if still in flight).

    Raises:
        WaitersFull: ``MAX_WAITERS`` requests of this process already wait.
        django.db.DatabaseError: the database failed.
    """
    if not waiters.enter():
        raise WaitersFull
    try:
        deadline = time.monotonic() + seconds
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                # lock_timeout bounds each lock wait on its own: the second gets what is
                # left of ``seconds``, so the two never add up to more.
                for statement in (sql.PG_WAIT_PRESENCE_SQL, sql.PG_WAIT_ROW_SQL):
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms < 1:
                        return False
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{left_ms}ms"])
                    cursor.execute(statement, _params(scope))
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                return False
            raise
        return True
    finally:
        waiters.leave()
