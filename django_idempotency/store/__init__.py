"""The store: every SQL statement of the claim / settle protocol. Nothing HTTP.

One contract, used by the protocol (views), the inbox and the operators' tools alike:

* :func:`claim` a scope (principal, endpoint, key) for a request with a fingerprint:
  a :class:`Claim` when the request owns the key, or the :class:`Existing` record that
  stands, which :func:`judge` (the one judge of a record) finds a replay, a mismatch
  or in flight (``store.claims``; the statements per store kind: ``store.records``);
* settle the claim: :func:`complete` it with the response, fenced by the owner token,
  inside the view's transaction; :func:`release` it (or :func:`abandon` it before the
  view ran); :func:`advance` its recovery point (a phase), :func:`suspend` it (a phase
  failed), :func:`extend` its lease (a heartbeat) (``store.settle``);
* :func:`fetch` what a scope holds (``store.rows``);
* operators: :func:`end_leases`, :func:`forget_responses`, and :func:`peek` at what a
  claim would meet without claiming (``store.operators``).

The machinery beside it: ``values`` (the plain values handed in and out, and how
bodies are stored), ``isolation`` (which transaction a statement runs in), ``routing``
(which database holds a record), ``clock`` (the one clock of leases and retention),
``presence`` (owner presence on PostgreSQL), ``heartbeat`` (the automatic heartbeat),
``reports`` (the outbox's gauges, and reads bounded in time for the audit),
``outbox`` (the outbox's statements: one contract, one implementation per store kind),
``sql`` and ``schema`` (the PostgreSQL statements, and what the migrations install).
Leases and expiry follow one clock: see ``django_idempotency.store.clock``. The names
above are loaded on first use, so that importing ``store.clock`` (the test kit does,
before Django is set up) does not import the models.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_idempotency.store.claims import Verdict, claim, judge
    from django_idempotency.store.isolation import own_transaction, stricter_than_read_committed
    from django_idempotency.store.operators import end_leases, forget_responses, peek
    from django_idempotency.store.rows import fetch
    from django_idempotency.store.settle import (
        abandon,
        advance,
        complete,
        extend,
        release,
        suspend,
    )
    from django_idempotency.store.values import (
        BY_LEASE,
        BY_OPERATOR,
        BY_PRESENCE,
        Claim,
        Existing,
        Headers,
        Scope,
        StoredResponse,
        decode_body,
        encode_body,
    )

__all__ = [
    "BY_LEASE",
    "BY_OPERATOR",
    "BY_PRESENCE",
    "Claim",
    "Existing",
    "Headers",
    "Scope",
    "StoredResponse",
    "Verdict",
    "abandon",
    "advance",
    "claim",
    "complete",
    "decode_body",
    "encode_body",
    "end_leases",
    "extend",
    "fetch",
    "forget_responses",
    "judge",
    "own_transaction",
    "peek",
    "release",
    "stricter_than_read_committed",
    "suspend",
]

#: The module of each name of the contract.
_HOMES = {
    "claim": "claims",
    "judge": "claims",
    "Verdict": "claims",
    "own_transaction": "isolation",
    "stricter_than_read_committed": "isolation",
    "end_leases": "operators",
    "forget_responses": "operators",
    "peek": "operators",
    "fetch": "rows",
    "abandon": "settle",
    "advance": "settle",
    "complete": "settle",
    "extend": "settle",
    "release": "settle",
    "suspend": "settle",
    "BY_LEASE": "values",
    "BY_OPERATOR": "values",
    "BY_PRESENCE": "values",
    "Claim": "values",
    "Existing": "values",
    "Headers": "values",
    "Scope": "values",
    "StoredResponse": "values",
    "decode_body": "values",
    "encode_body": "values",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
