"""The inbox: run any callable once per idempotency key, outside HTTP (docs/inbox.md).

The same protocol as a view, through the same store: claim the scope (principal,
endpoint, key) in its own short transaction, run the body in ``transaction.atomic()``
on the record's database, and complete the record in that transaction, fenced by the
owner token, with the body's result stored as JSON. A second call with the same key
does not run the body and gets the stored result; a call while the first still holds
its lease gets ``exceptions.InFlight``; a call with the same key and another payload gets
``exceptions.KeyReused``. An exception rolls the body back and releases the key, so a retry
runs it again. A crash (the process killed mid-body) leaves a claim whose lease runs
out, and the next call with the key takes it over. Records are swept after their
retention window like a view's (docs/retention.md).

* :func:`once`, a context manager, for a block: ``with once(key, ...) as attempt``;
* :func:`idempotent_call`, a decorator, for a function whose arguments carry the key;
* ``django_idempotency.inbox.celery`` builds Celery tasks on :func:`idempotent_call`.

What the body does to its transaction is its outcome, as for a view: a body that marks
it for rollback (``transaction.set_rollback(True)``, or on PostgreSQL a database error
caught without a savepoint) has its result returned unstored and the key released. A
block opened inside a running block or view with the same scope is part of it
(``context.running``): it runs, and the outer one stores the result.

Inside the body, ``django_idempotency.current()`` is the attempt's context
(``extend_lease()``, ``derive_key()``; ``outbox.enqueue`` links its messages to the
record and derives their dedup keys from it), as in a view.
"""

from __future__ import annotations

from django_idempotency.inbox.calls import (
    Attempt,
    encode_result,
    idempotent_call,
    once,
    payload_fingerprint,
)

__all__ = ["Attempt", "encode_result", "idempotent_call", "once", "payload_fingerprint"]
