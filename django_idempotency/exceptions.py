"""Every error (and the one warning) of django-idempotency that a project may catch.

Each class derives from :class:`IdempotencyError` and from the built-in error it
behaves as (``ValueError`` for bad input, ``RuntimeError`` for a misuse at run time,
``django.db.DatabaseError`` for a lost lease, which must roll back like a database
error), so ``except IdempotencyError`` catches all of them and existing ``except
ValueError`` clauses keep working.

======================== ================================================================
error                    raised when
======================== ================================================================
:class:`InvalidKey`      an idempotency key is unusable (HTTP: 400 ``invalid-key``)
:class:`KeyReused`       ``inbox.once()``: the key was used with another payload (422)
:class:`InFlight`        ``inbox.once()``: a call with the key holds a live lease (409)
:class:`UnstorableResult` ``inbox.once()``: the block's result is not JSON, or too large
:class:`LeaseLost`       the claim was taken over while running; everything rolled back
:class:`HeartbeatUnavailable` a heartbeat on a database above READ COMMITTED
:class:`CrossDatabaseWrite` a write to another database than the record's (refused)
:class:`PhaseError`      a phase used out of order, twice, nested or undeclared
:class:`NotInTransaction` ``outbox.enqueue()`` outside ``transaction.atomic()``
:class:`SignatureRefused` a signed sender's request whose signature is missing, malformed
                         or wrong (HTTP: 403 ``invalid-signature``)
======================== ================================================================

:class:`OuterTransactionWarning` is a warning, not an error: a claim made inside a
transaction the app did not open (docs/faq.md).
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

__all__ = [
    "CrossDatabaseWrite",
    "HeartbeatUnavailable",
    "IdempotencyError",
    "InFlight",
    "InvalidKey",
    "KeyReused",
    "LeaseLost",
    "NotInTransaction",
    "OuterTransactionWarning",
    "PhaseError",
    "SignatureRefused",
    "UnstorableResult",
]


class IdempotencyError(Exception):
    """The base of every error of django-idempotency."""


class InvalidKey(IdempotencyError, ValueError):
    """An idempotency key (the header, a key extractor's, ``once()``'s) is unusable.

    ``str(exc)`` is the client-facing detail of the 400 ``invalid-key`` problem
    (docs/problems.md); it never quotes the key.
    """


class SignatureRefused(IdempotencyError, ValueError):
    """A request to a signed sender's view whose signature is refused (before the claim).

    Raised by the principal resolver :func:`~django_idempotency.principals.signed_principal`
    returns, when the signature header is missing, malformed or does not match the body;
    the view answers 403 ``invalid-signature`` (docs/problems.md) and nothing is claimed
    or run. ``str(exc)`` is the client-facing detail; it never quotes the signature.
    """


class KeyReused(IdempotencyError, ValueError):
    """``inbox.once()``: the key was already used with a different payload (a view's 422)."""


class InFlight(IdempotencyError, RuntimeError):
    """``inbox.once()``: another call with this key holds a live lease (a view's 409).

    Args:
        endpoint: the record's endpoint (``"task:billing.apply"``).
        retry_after: seconds until that lease ends (then a call takes it over, or
            finds the stored result); negative values count as 0.

    Attributes:
        endpoint: as given.
        retry_after: seconds, at least 0.
    """

    def __init__(self, endpoint: str, retry_after: float) -> None:
        super().__init__(
            f"{endpoint}: a call with this idempotency key is in progress; retry after "
            f"{max(0.0, retry_after):.1f} s with the same key to get its result"
        )
        self.endpoint = endpoint
        self.retry_after = max(0.0, retry_after)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by Celery's result backends
        return (type(self), (self.endpoint, self.retry_after))


class UnstorableResult(IdempotencyError, TypeError):
    """``inbox.once()``: the block's result is not JSON, or over ``MAX_RESPONSE_BYTES``.

    Raised inside the block's transaction, so its writes roll back and the key is
    released: nothing was done, as if the block had raised.
    """


class LeaseLost(IdempotencyError, DatabaseError):
    """The fenced completion (or phase) matched no row: another request took the key over.

    Raised inside the view's (or phase's, or block's) transaction, so everything it
    wrote rolls back; a view answers 409 ``lease-lost`` (docs/protocol.md). A
    ``DatabaseError``, so code that rolls back on database errors rolls back on it too.
    """


class HeartbeatUnavailable(IdempotencyError, RuntimeError):
    """A heartbeat was asked for on a database above READ COMMITTED.

    The heartbeat commits beside the view's open transaction; at REPEATABLE READ or
    SERIALIZABLE, PostgreSQL would then refuse the view's own fenced completion of the
    same row (a serialization failure), so the view could never complete. Give such
    views a lease longer than their longest run, or use READ COMMITTED for the
    database that holds the records (docs/storage.md).
    """


class CrossDatabaseWrite(IdempotencyError, RuntimeError):
    """An idempotent view (or ``once()`` block) wrote to another database than its record's.

    Raised by the statement itself, which is not sent; the view's transaction rolls
    back and the key is released (docs/deployment.md, "Several databases"). Fix: keep
    the record where the view writes (the view's ``using=``, the ``DATABASE_RESOLVER``
    setting or the router), or make the view phased.

    Args:
        view: the view's (task's, function's) dotted name.
        endpoint: the record's endpoint.
        record_database: the alias holding the record.
        database: the alias the refused statement was sent to.
        kind: what ran, for the message: ``"view"`` or ``"block"``.
    """

    def __init__(
        self, view: str, endpoint: str, record_database: str, database: str, kind: str = "view"
    ) -> None:
        self.view, self.endpoint = view, endpoint
        self.record_database, self.database, self.kind = record_database, database, kind
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

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.view, self.endpoint, self.record_database, self.database, self.kind),
        )


class PhaseError(IdempotencyError, RuntimeError):
    """A phase was used out of order, twice, nested, or not declared on the view."""


class NotInTransaction(IdempotencyError, RuntimeError):
    """``outbox.enqueue()`` was called outside ``transaction.atomic()``.

    A message written in autocommit mode would be sent even if the surrounding work
    failed, which is what the outbox exists to prevent. Enqueue inside the view's
    transaction (an idempotent view runs in one), a phase, or an ``atomic()`` block.
    """


class OuterTransactionWarning(RuntimeWarning):
    """An ``Idempotency-Key`` was claimed inside a transaction the app did not open.

    The claim then joins that transaction and becomes visible to other requests only
    when it commits: a duplicate waits for the original instead of getting the 409
    ``request-in-flight``. Emitted once per endpoint per process; see docs/faq.md
    ("Duplicates wait instead of getting a 409").
    """
