"""Owner presence on PostgreSQL: a lock the owner's session holds while it executes.

The rule (docs/robustness.md#owner-presence): a claim made on a direct connection
takes a session-level advisory lock keyed by the record's scope, in the claim's own
statement, and records the session's backend pid in ``owner_pid``. The lock is
released in the statement that completes or releases the claim. PostgreSQL releases
it by itself when the session ends, so a duplicate that finds the record claimed with
a live lease, ``owner_pid`` set and the lock free knows the owner is gone and takes the
claim over at once (in its claim statement: no extra round trip). A live owner holds
the lock however slow it is (stopped, paused, waiting on a downstream call), so it is
never taken over early: the lease decides, as without presence.

Behind a transaction pooler a client's statements run on whichever server session is
free, so a session lock would stay behind on one of them: the owner then takes no lock
(``owner_pid`` stays ``NULL``) and the lease alone decides. Whether a connection is
direct is the ``OWNER_PRESENCE`` setting: ``"auto"`` (default), ``True`` or ``False``
(:func:`takes`).

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
from contextlib import suppress
from typing import Any

from django.db import DatabaseError, OperationalError, connections, transaction

from . import _pg
from ._pg_partitioned import server_port
from .claims import Claim, Scope
from .conf import conf

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


# The claims whose presence lock is held: owner token -> the DB-API connection (its
# session holds the lock; a reconnected wrapper's new session holds nothing).
_held: dict[uuid.UUID, Any] = {}
_held_lock = threading.Lock()


def _ref(raw: Any) -> Any:
    try:
        return weakref.ref(raw)
    except TypeError:
        return lambda: raw


def hold(claim: Claim) -> None:
    """Note that ``claim``'s session holds its presence lock."""
    raw = connections[claim.using].connection
    with _held_lock:
        _held[claim.owner_token] = _ref(raw)


def dropped(claim: Claim) -> None:
    """Note that ``claim``'s presence lock was released (by a statement that did it)."""
    with _held_lock:
        _held.pop(claim.owner_token, None)


def holds(claim: Claim) -> bool:
    """Whether ``claim``'s presence lock is still held, as far as this process knows."""
    with _held_lock:
        return claim.owner_token in _held


def unlock(using: str, scope: Scope) -> None:
    """Release the presence lock of ``scope`` held by this thread's session (best effort)."""
    connection = connections[using]
    if connection.connection is None or connection.needs_rollback:
        return
    with suppress(DatabaseError), connection.cursor() as cursor:
        cursor.execute(_pg.PG_UNLOCK_SQL, _params(scope))


def ensure_released(claim: Claim) -> None:
    """Release ``claim``'s presence lock if no statement did (a path that failed).

    The completing and releasing statements release it themselves; this costs a round
    trip only when neither ran (a suspended phased claim, a store failure). A session
    that was replaced since (reconnected) held nothing to release.
    """
    with _held_lock:
        ref = _held.pop(claim.owner_token, None)
    if ref is None:
        return
    connection = connections[claim.using]
    raw = ref()
    if raw is None or connection.connection is not raw:
        return
    unlock(claim.using, claim.scope)


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
                for statement in (_pg.PG_WAIT_PRESENCE_SQL, _pg.PG_WAIT_ROW_SQL):
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
