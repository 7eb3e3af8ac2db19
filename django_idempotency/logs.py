"""Structured log lines for every decision of the protocol (docs/observability.md).

One line per decision on the ``django_idempotency.events`` logger, with these
``extra=`` fields (attributes of the ``LogRecord``, for JSON formatters):

* ``event``: ``claimed``, ``taken_over``, ``replayed``, ``in_flight``, ``key_reused``,
  ``fenced``, ``released``, ``completed``, ``store_failed`` or ``near_lease`` (an
  execution ran past ``LEASE_WARNING_FRACTION`` of its lease; with ``duration`` and
  ``lease`` in seconds);
* ``endpoint``: ``"POST /v1/workers"``; ``principal``: ``"auth.user:42"``;
* ``status``: the HTTP status answered or stored (``None`` when the view raised);
* ``key_hash``: :func:`key_hash` of the key. The key itself is never logged;
* ``cause``, on ``taken_over`` lines only: why the earlier attempt's claim could be
  taken over, ``presence`` (its database session ended while its lease was live),
  ``lease`` (its lease expired) or ``operator`` (an operator ended its lease).

Levels: DEBUG for claims, INFO for replays, completions, releases and 409s, WARNING
for 422s, takeovers, fenced rollbacks and executions near their lease, ERROR for store
failures. The receivers are connected when the app is ready (``apps.py``); the
logger's level decides what is written (docs/observability.md).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Protocol

from django_idempotency import signals

logger = logging.getLogger("django_idempotency.events")

_UID = "django_idempotency.logs"


def key_hash(key: str) -> str:
    """A short, stable fingerprint of an idempotency key, safe to log.

    The first 12 hex characters of SHA-256 over the key (48 bits): enough to find
    one key's lines, useless for replaying it. Compute it for a key a customer
    reports to grep the logs: ``key_hash("8e03978e-...")``.
    """
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class _Scoped(Protocol):
    @property
    def principal(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def key(self) -> str: ...


def scope_fields(scope: _Scoped) -> dict[str, str]:
    """The ``principal``, ``endpoint`` and ``key_hash`` of a scope (a ``store.Scope``).

    The fields every log line and every signal about a claimed key carry (the key
    itself never: its :func:`key_hash`).
    """
    return {
        "principal": scope.principal,
        "endpoint": scope.endpoint,
        "key_hash": key_hash(scope.key),
    }


def _log(
    level: int,
    event: str,
    status: int | None,
    kwargs: dict[str, Any],
    note: str = "",
    **fields: Any,
) -> None:
    if not logger.isEnabledFor(level):
        return
    extra = {
        "event": event,
        "endpoint": kwargs.get("endpoint", ""),
        "principal": kwargs.get("principal", ""),
        "status": status,
        "key_hash": kwargs.get("key_hash", ""),
        **fields,
    }
    logger.log(
        level,
        "idempotency %s: %s status=%s key=%s%s",
        event,
        extra["endpoint"],
        "-" if status is None else status,
        extra["key_hash"] or "-",
        note,
        extra=extra,
    )


#: What a ``taken_over`` line says about each cause (``claims.BY_*``).
_TAKEOVER_NOTES = {
    "presence": " (the earlier attempt's database session ended while its lease was live)",
    "lease": " (an earlier attempt's lease expired)",
    "operator": " (an operator ended the earlier attempt's lease)",
}


def _claimed(
    sender: Any,
    *,
    taken_over: bool = False,
    presence: bool = False,
    cause: str = "",
    **kwargs: Any,
) -> None:
    if taken_over:
        cause = cause or ("presence" if presence else "lease")
        note = _TAKEOVER_NOTES.get(cause, f" ({cause})")
        _log(logging.WARNING, "taken_over", None, kwargs, note, cause=cause)
    else:
        _log(logging.DEBUG, "claimed", None, kwargs)


def _replayed(sender: Any, *, status: int, **kwargs: Any) -> None:
    _log(logging.INFO, "replayed", status, kwargs)


def _in_flight(sender: Any, **kwargs: Any) -> None:
    _log(logging.INFO, "in_flight", 409, kwargs)


def _mismatched(sender: Any, **kwargs: Any) -> None:
    _log(logging.WARNING, "key_reused", 422, kwargs, " (same key, different request)")


def _fenced(sender: Any, **kwargs: Any) -> None:
    _log(logging.WARNING, "fenced", 409, kwargs, " (lease lost; the view's writes rolled back)")


def _released(sender: Any, *, status: int | None = None, **kwargs: Any) -> None:
    _log(logging.INFO, "released", status, kwargs, " (view raised)" if status is None else "")


def _completed(sender: Any, *, status: int, **kwargs: Any) -> None:
    _log(logging.INFO, "completed", status, kwargs)


def _store_failed(sender: Any, *, error: BaseException | None = None, **kwargs: Any) -> None:
    # The error's text may quote SQL parameters (the key): only its type above DEBUG.
    _log(logging.ERROR, "store_failed", 503, kwargs, f" ({type(error).__name__})")
    _log(logging.DEBUG, "store_failed", 503, kwargs, f" ({type(error).__name__}: {error})")


def _executed(
    sender: Any, *, duration: float, lease: float, near_lease: bool = False, **kwargs: Any
) -> None:
    if not near_lease:
        return
    note = (
        f" (ran {duration:.1f} s of its {lease:g} s lease, {duration / lease:.0%}: a retry "
        "takes the key over once the lease ends; raise the view's lease or heartbeat)"
    )
    _log(logging.WARNING, "near_lease", None, kwargs, note, duration=duration, lease=lease)


_RECEIVERS = {
    "claimed": _claimed,
    "replayed": _replayed,
    "in_flight": _in_flight,
    "mismatched": _mismatched,
    "fenced": _fenced,
    "released": _released,
    "completed": _completed,
    "store_failed": _store_failed,
    "executed": _executed,
}


def connect() -> None:
    """Connect the log receivers to ``django_idempotency.signals`` (idempotent)."""
    for name, receiver in _RECEIVERS.items():
        getattr(signals, name).connect(receiver, dispatch_uid=f"{_UID}.{name}")


def disconnect() -> None:
    """Disconnect them: no log line from this module afterwards."""
    for name in _RECEIVERS:
        getattr(signals, name).disconnect(dispatch_uid=f"{_UID}.{name}")
