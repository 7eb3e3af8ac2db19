"""The transactional outbox: effects outside the database, delivered after the commit.

A view records an effect outside the database (boot a VM, send an e-mail) with
:func:`enqueue`, in its own transaction, so the message exists if and only if the
view's writes committed. The relay delivers it after the commit by calling the handler
registered for its topic with the message's dedup key, which the handler passes
downstream so that a redelivery converges on the same downstream effect::

    from django_idempotency import outbox

    @outbox.handler("worker.boot")
    def boot(message, dedup_key):
        hypervisor.boot(message.payload["worker_id"], boot_id=dedup_key)

    # in a view, inside its transaction:
    outbox.enqueue("worker.boot", {"worker_id": worker.pk})

The modules, in the order a message goes through them: ``enqueue`` (write it),
``kick`` (start the relay task after the commit, in the background), ``handlers``
(the registry: which function delivers which topic), ``relay`` (:class:`Relay`,
:func:`deliver_batch`, :func:`deliver_due`), then the relay's steps ``claim``,
``deliver``, ``failures`` and ``marks``. See docs/outbox.md.
"""

from __future__ import annotations

from django_idempotency.outbox.enqueue import enqueue
from django_idempotency.outbox.failures import backoff
from django_idempotency.outbox.handlers import (
    HANDLER_MODULE,
    Handler,
    autodiscover,
    get_handler,
    register,
    unregister,
)
from django_idempotency.outbox.kick import kick, wait_for_kicks
from django_idempotency.outbox.relay import Relay, deliver_batch, deliver_due

#: ``@outbox.handler("worker.boot")``: the same as :func:`register`.
handler = register

__all__ = [
    "HANDLER_MODULE",
    "Handler",
    "Relay",
    "autodiscover",
    "backoff",
    "deliver_batch",
    "deliver_due",
    "enqueue",
    "get_handler",
    "handler",
    "kick",
    "register",
    "unregister",
    "wait_for_kicks",
]
