"""What the app can tell about the current transaction, without a round trip.

* :func:`doomed`: the view left the transaction unable to commit: it asked for a
  rollback (``transaction.set_rollback(True)``, or an inner ``atomic(savepoint=False)``
  that raised), or, on PostgreSQL, a statement failed and was caught without a
  savepoint, so the server refuses every further statement. Nothing the view wrote
  can commit: the app releases the key and answers the view's response as is.
* :func:`outer_block`: the claim is about to be made inside an ``atomic()`` block the
  app did not open (``@transaction.atomic`` above ``@idempotent``, or ``ATOMIC_REQUESTS``
  on a view that is not exempt). :func:`warn_outer` reports it once per endpoint.

The blocks that ``django.test.TestCase`` (and pytest-django's ``db`` fixture) wrap
every test in are marked ``_from_testcase`` by Django and are not outer blocks; nor are
the app's own blocks (:func:`atomic`), so an idempotent view called from inside
another one's transaction is not reported.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

from django.db import connections, transaction

from django_idempotency.exceptions import OuterTransactionWarning

logger = logging.getLogger("django_idempotency")

#: ``PQtransactionStatus`` of a transaction a failed statement aborted
#: (psycopg's ``pq.TransactionStatus.INERROR``, psycopg2's ``TRANSACTION_STATUS_INERROR``).
_INERROR = 3

_FAQ = "the FAQ, 'Duplicates wait instead of getting a 409' (docs/faq.md)"

_warned: set[str] = set()
_warned_lock = threading.Lock()


class _AppAtomic(transaction.Atomic):
    """An ``atomic()`` block the app opened itself (see :func:`outer_block`)."""


def atomic(using: str, *, durable: bool = False) -> transaction.Atomic:
    """``transaction.atomic(using=using, durable=durable)``, marked as the app's own."""
    return _AppAtomic(using, True, durable)


def doomed(using: str) -> str:
    """Why the transaction on ``using`` can no longer commit, or ``""`` (no query sent).

    Args:
        using: the database alias, inside an ``atomic()`` block on it.

    Returns:
        ``"rollback"`` when Django marked the block for rollback (``set_rollback(True)``,
        an inner ``atomic(savepoint=False)`` that raised); ``"aborted"`` when the
        driver reports a PostgreSQL transaction aborted by a failed statement
        (``INERROR``: an error caught without a savepoint); else ``""``.
    """
    if transaction.get_rollback(using):
        return "rollback"
    raw = connections[using].connection
    info = getattr(raw, "info", None)  # psycopg 3 and psycopg2 >= 2.8: libpq's status
    status = getattr(info, "transaction_status", None)
    if status is not None and int(status) == _INERROR:
        return "aborted"
    return ""


def outer_block(using: str) -> bool:
    """Whether ``using`` is inside an ``atomic()`` block someone else opened.

    Neither the blocks of a test case (Django marks them ``_from_testcase``) nor the
    app's own (:func:`atomic`) count. No query is sent.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        return False
    blocks: list[Any] = connection.atomic_blocks
    return any(
        not getattr(block, "_from_testcase", False) and not isinstance(block, _AppAtomic)
        for block in blocks
    )


def warn_outer(endpoint: str, view_name: str, using: str) -> None:
    """Report a claim made inside an outer transaction, once per endpoint per process.

    Emits :class:`OuterTransactionWarning` (``warnings.warn``) and logs the same text at
    WARNING on the ``django_idempotency`` logger.

    Args:
        endpoint: the record's endpoint (``"POST /v1/workers"``).
        view_name: dotted name of the view.
        using: the database alias of the record.
    """
    with _warned_lock:
        if endpoint in _warned:
            return
        _warned.add(endpoint)
    if connections[using].settings_dict.get("ATOMIC_REQUESTS"):
        cause = f"ATOMIC_REQUESTS on the {using!r} database, or a transaction.atomic block"
        fix = (
            "Exempt the view: add IdempotentMixin to an APIView or ViewSet, put "
            "@idempotent above @api_view, or decorate the class's dispatch with "
            "@method_decorator(transaction.non_atomic_requests, name='dispatch'); "
            "remove any @transaction.atomic above @idempotent."
        )
    else:
        cause = "a transaction.atomic block"
        fix = (
            "Remove @transaction.atomic (or the `with transaction.atomic()`) around the "
            "idempotent view, or move it below @idempotent: the app already runs the "
            "view in its own transaction, committed together with the stored response."
        )
    message = (
        f"{view_name} ({endpoint}) claimed its Idempotency-Key inside a transaction "
        f"the app did not open ({cause}): the claim is not visible to other requests "
        "until that transaction commits, so a duplicate waits for the original instead "
        f"of getting a 409 request-in-flight. {fix} See {_FAQ}"
    )
    logger.warning(message, extra={"endpoint": endpoint})
    warnings.warn(message, OuterTransactionWarning, stacklevel=2)


def reset_warnings() -> None:
    """Forget which endpoints were warned about, so they warn again (for tests)."""
    with _warned_lock:
        _warned.clear()
