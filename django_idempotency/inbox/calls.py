"""``once()`` and ``idempotent_call``: the inbox's protocol for blocks and functions.

Claim, run the body in the record's transaction, complete fenced by the owner token,
release on an exception: the same steps as a view's (``protocol``), with the body's
JSON result in place of a response. See the package's docstring and docs/inbox.md.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

from django.db import transaction

from django_idempotency import exceptions, signals, store, transactions
from django_idempotency.conf import conf
from django_idempotency.exceptions import InFlight, KeyReused, UnstorableResult
from django_idempotency.logs import scope_fields
from django_idempotency.protocol.begin import fit
from django_idempotency.protocol.context import IdempotencyContext, running
from django_idempotency.protocol.execute import executed
from django_idempotency.protocol.keys import check_key
from django_idempotency.protocol.release import announce, release_claim
from django_idempotency.store import presence
from django_idempotency.store.routing import record_database
from django_idempotency.transactions import write_guard

logger = logging.getLogger("django_idempotency")

F = TypeVar("F", bound=Callable[..., Any])

#: Version tag of the payload fingerprint (no request's fingerprint hashes it: theirs
#: start with ``fp3:``, and match a payload fingerprint only if equal to it).
_FINGERPRINT_TAG = b"inbox1\x00"
#: What a stored result looks like in the record (its ``response_*`` columns).
_RESULT_STATUS = 200
_RESULT_HEADERS = [("Content-Type", "application/json")]
_COLUMN = 255


class Attempt:
    """What ``with once(...) as attempt`` gives the block.

    Attributes:
        done: ``True`` when an earlier call with this key completed: the block must
            not do the work again (``if attempt.done: return attempt.result``).
        result: the stored result when ``done``; otherwise set it in the block, and
            it is stored (JSON) when the block ends without an exception.
        context: the attempt's ``IdempotencyContext`` (``None`` when ``done``).
    """

    def __init__(self, *, done: bool, result: Any, context: IdempotencyContext | None) -> None:
        self.done = done
        self.result = result
        self.context = context

    @property
    def taken_over(self) -> bool:
        """Whether this attempt took over an earlier one's claim (``context.takeover_cause``)."""
        return self.context is not None and self.context.taken_over

    def extend_lease(self, seconds: float | None = None) -> bool:
        """Heartbeat for a long body (``IdempotencyContext.extend_lease``); ``True`` if done."""
        return True if self.context is None else self.context.extend_lease(seconds)


def payload_fingerprint(payload: Any) -> str:
    """SHA-256 (64 hex characters) of ``payload`` as canonical JSON (sorted keys).

    Raises:
        TypeError: ``payload`` is not JSON (a model instance, a set, ``NaN``...).
    """
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the payload that fingerprints this call is not JSON ({exc}); pass "
            "payload= with the JSON data that identifies the work"
        ) from None
    return hashlib.sha256(_FINGERPRINT_TAG + text.encode()).hexdigest()


def encode_result(result: Any) -> bytes:
    """``result`` as the JSON bytes stored in the record.

    Raises:
        UnstorableResult: not JSON (``NaN`` and infinities included), or longer than
            the ``MAX_RESPONSE_BYTES`` setting.
    """
    try:
        body = json.dumps(result, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise UnstorableResult(
            f"the result {type(result).__name__} cannot be stored as JSON ({exc}); "
            "return JSON data (dicts, lists, strings, numbers, booleans, None)"
        ) from None
    limit = conf.max_response_bytes
    if limit is not None and len(body) > limit:
        raise UnstorableResult(
            f"the result is {len(body)} bytes of JSON; MAX_RESPONSE_BYTES allows {limit}. "
            "Store large results elsewhere and return their id"
        )
    return body


@contextmanager
def once(
    key: str,
    *,
    principal: str,
    endpoint: str,
    payload: Any = None,
    lease: float | None = None,
    retention: float | None = None,
    using: str | None = None,
) -> Iterator[Attempt]:
    """Run the block at most once per key, its writes and the result committed together.

    Python cannot skip a ``with`` body, so the block checks ``attempt.done``::

        with once(event["id"], principal="webhook:billing", endpoint="billing.apply",
                  payload=event) as attempt:
            if attempt.done:
                return attempt.result
            invoice = apply(event)
            attempt.result = {"invoice": invoice.pk}

    Args:
        key: the idempotency key, 1 to 255 printable ASCII characters (an event id).
        principal: who the key belongs to (``"webhook:billing"``); keys of two
            principals never meet.
        endpoint: which operation (``"task:billing.apply"``); with the principal and
            the key, it names the record.
        payload: JSON data identifying the work; the same key with another payload
            raises :class:`KeyReused`. ``None`` by default.
        lease: seconds a running block holds off duplicates (default ``LEASE``);
            after it, a crashed block's key is taken over by the next call.
        retention: seconds the result is kept and returned (default ``RETENTION``).
        using: the records' database alias (default: the router's choice); the block
            runs in a transaction on it, and its writes to any other database are
            refused (``exceptions.CrossDatabaseWrite``, docs/deployment.md).

    A block that leaves its transaction unable to commit (``transaction.set_rollback``,
    a PostgreSQL error caught without a savepoint) ends the ``with`` statement normally
    with nothing stored and the key released (``attempt.result`` as the block left it).
    A release the store fails (a ``DatabaseError``) is logged at ``ERROR``, as a view's
    is, and the block's own exception is the one raised; the key is taken over once its
    lease runs out.
    Called inside a running block or view that claimed the same scope on ``using``, the
    block is part of that execution: it runs, nothing is claimed or stored for it, and
    ``attempt.context`` is the running one's (docs/inbox.md).

    Raises:
        exceptions.InvalidKey: the key, principal or endpoint is unusable.
        TypeError: the payload is not JSON.
        KeyReused: the key was used with another payload.
        InFlight: another call with the key is running (its lease is live).
        UnstorableResult: the block's ``attempt.result`` cannot be stored (rolled back).
        exceptions.CrossDatabaseWrite: the block wrote to another database than
            ``using`` (rolled back, key released).
        exceptions.LeaseLost: the lease ran out and another call took the key over while
            the block ran (rolled back).
        django.db.DatabaseError: the store failed (nothing claimed, or rolled back).
        Whatever the block raised (``SystemExit`` and ``KeyboardInterrupt`` included),
        after rolling back and releasing the key; whatever a ``claimed`` signal
        receiver raised, before the block ran, the key released.
    """
    max_length = min(conf.max_key_length, _COLUMN)
    key = check_key(key, where="the key argument", max_length=max_length)
    if not principal or not isinstance(principal, str):
        raise exceptions.InvalidKey("once() needs a principal: a non-empty string")
    if not endpoint or not isinstance(endpoint, str):
        raise exceptions.InvalidKey("once() needs an endpoint: a non-empty string")
    scope = store.Scope(fit(principal), fit(endpoint), key)
    fp = payload_fingerprint(payload)
    lease = conf.lease if lease is None else float(lease)
    retention = conf.retention if retention is None else float(retention)
    using = using or record_database()
    outer = running(scope, using)
    if outer is not None:
        # Called by the running block (or view) that claimed this very scope: part of
        # its execution, in its transaction; that one stores the result.
        yield Attempt(done=False, result=None, context=outer)
        return
    with presence.entry_point("once() block"):
        found = store.claim(scope, fp, lease=lease, retention=retention, using=using)
        if isinstance(found, store.Existing):
            yield _existing(scope, fp, found)
            return
        claim = found
        announce(claim)
        context = IdempotencyContext(claim, lease=lease)
        attempt = Attempt(done=False, result=None, context=context)
        started = time.monotonic()
        try:
            with (
                context.activated(),
                transaction.atomic(using=using),
                write_guard.guard(scope.endpoint, scope.endpoint, using, kind="block") as guard,
            ):
                yield attempt
                guard.check()  # a refused write the body caught still fails the attempt
                doomed = transactions.doomed(using)
                if doomed:  # the block's own choice: nothing of it can commit
                    raise _Doomed(doomed)
                body = encode_result(attempt.result)
                attempt.result = json.loads(body)  # what every later call gets, too
                store.complete(claim, store.StoredResponse(_RESULT_STATUS, _RESULT_HEADERS, body))
        except _Doomed as doomed_block:
            _log_doomed(scope, doomed_block.reason)
            release_claim(claim, None)
            return
        except exceptions.LeaseLost:
            signals.fenced.send(scope.endpoint, **scope_fields(scope))
            raise
        except BaseException:
            release_claim(claim, None)
            raise
        finally:
            presence.ensure_released(claim)  # the settling statement normally did it
            executed(claim, time.monotonic() - started, lease, context.lease_renewed)
        signals.completed.send(scope.endpoint, status=_RESULT_STATUS, **scope_fields(scope))


class _Doomed(Exception):
    """The block left its transaction unable to commit (``reason``: ``transactions.doomed``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _existing(scope: store.Scope, fp: str, found: store.Existing) -> Attempt:
    """The attempt of a call whose key stands claimed or completed (or an error)."""
    verdict = store.judge(found, fp)
    if verdict is store.Verdict.MISMATCH:
        signals.mismatched.send(scope.endpoint, **scope_fields(scope))
        raise KeyReused(
            f"{scope.endpoint}: this idempotency key was already used with a different "
            "payload; use a new key for new work"
        )
    if verdict is store.Verdict.IN_FLIGHT or found.response is None:
        signals.in_flight.send(scope.endpoint, **scope_fields(scope))
        raise InFlight(scope.endpoint, found.lease_remaining)
    signals.replayed.send(
        scope.endpoint,
        status=found.response.status,
        age=found.age,
        window=found.window,
        near_window_end=signals.replay_near_window_end(found.age, found.window),
        **scope_fields(scope),
    )
    stored = json.loads(found.response.body) if found.response.replayable else None
    return Attempt(done=True, result=stored, context=None)


def _log_doomed(scope: store.Scope, reason: str) -> None:
    """Log a block whose result is not stored because its transaction is doomed."""
    extra = {"principal": scope.principal, "endpoint": scope.endpoint}
    if reason == "rollback":  # deliberate: transaction.set_rollback(True)
        logger.info(
            "the once() block marked its transaction for rollback: its result is not "
            "stored and the key released",
            extra=extra,
        )
        return
    logger.warning(
        "the once() block caught a database error without a savepoint, which aborted its "
        "transaction: nothing was committed, its result is not stored and the key "
        "released. Wrap the statement that may fail in transaction.atomic().",
        extra=extra,
    )


ArgsCallable = Callable[..., Any]


def _arguments(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's arguments by name (defaults applied), a bound ``self`` left out."""
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    params = list(inspect.signature(func).parameters)
    if params and params[0] == "self":
        values.pop("self", None)
    return values


def _pick(
    value: str | ArgsCallable,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> Any:
    if callable(value):
        return value(*args, **kwargs)
    arguments = _arguments(func, args, kwargs)
    if value not in arguments:
        raise TypeError(f"{what}={value!r}: {func.__qualname__} has no argument {value!r}")
    return arguments[value]


def idempotent_call(
    *,
    key: str | ArgsCallable,
    principal: str | ArgsCallable,
    endpoint: str | None = None,
    payload: ArgsCallable | None = None,
    lease: float | None = None,
    retention: float | None = None,
    using: str | None = None,
) -> Callable[[F], F]:
    """Make a function run its body at most once per key; later calls get its result.

    ::

        @idempotent_call(key="event_id", principal="consumer:invoices")
        def apply_invoice_event(event_id: str, amount: int) -> dict:
            ...

    Args:
        key: the name of the argument holding the idempotency key, or
            ``callable(*args, **kwargs) -> str``.
        principal: a fixed principal, or ``callable(*args, **kwargs) -> str``
            (a plain string is always the principal itself, never an argument name).
        endpoint: the operation's name (default ``"call:<module>.<qualname>"``);
            renaming the function changes the default, so pin it for records that
            must outlive a rename.
        payload: ``callable(*args, **kwargs) -> JSON`` identifying the work (default:
            the arguments by name, which must then be JSON); the same key with another
            payload raises :class:`KeyReused`.
        lease: seconds a running body holds off duplicates (as for :func:`once`).
        retention: seconds the result is kept and returned (as for :func:`once`).
        using: the records' database alias (as for :func:`once`).

    The decorated function returns its result as stored, after a JSON round trip
    (a tuple comes back as a list), the same on the first call and on every later one.

    Raises:
        The errors of :func:`once`; ``TypeError`` for a ``key`` naming no argument.
    """

    def decorator(func: F) -> F:
        name = endpoint or f"call:{func.__module__}.{func.__qualname__}"

        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            the_key = _pick(key, func, args, kwargs, "key")
            if isinstance(the_key, int) and not isinstance(the_key, bool):
                the_key = str(the_key)  # an integer id is its decimal digits
            who = principal(*args, **kwargs) if callable(principal) else principal
            data = payload(*args, **kwargs) if payload else _arguments(func, args, kwargs)
            with once(
                the_key,
                principal=who,
                endpoint=name,
                payload=data,
                lease=lease,
                retention=retention,
                using=using,
            ) as attempt:
                if not attempt.done:
                    attempt.result = func(*args, **kwargs)
            return attempt.result

        wrapper._idempotency_endpoint = name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator
