"""Celery tasks that run their body once per idempotency key (docs/inbox.md).

Celery delivers at least once: with ``acks_late``, a worker killed mid-task or a
broker's visibility timeout runs the same task again, and a producer may send one
piece of work twice. :func:`idempotent_task` puts the inbox (``inbox.idempotent_call``)
between Celery and the task's body: the body runs in ``transaction.atomic()``, its
return value (JSON) is stored by the fenced completion in the same transaction, and a
redelivered or duplicated task with the same key returns the stored value without
running the body. A task that raises releases its key, so Celery's retry
(``autoretry_for``, ``self.retry``) runs the body again. A duplicate that arrives
while the original runs is retried by Celery after the original's lease (or fails
with ``exceptions.InFlight`` once its retries are used up).

Imports Celery; install ``django-idempotency[celery]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from celery import current_task, shared_task  # type: ignore[import-untyped]

from django_idempotency.exceptions import InFlight
from django_idempotency.inbox.calls import ArgsCallable, idempotent_call
from django_idempotency.store import presence

F = TypeVar("F", bound=Callable[..., Any])

#: The principal of task records unless a task names its own.
DEFAULT_PRINCIPAL = "celery"


def idempotent_task(
    *,
    key: str | ArgsCallable,
    principal: str | ArgsCallable = DEFAULT_PRINCIPAL,
    name: str | None = None,
    payload: ArgsCallable | None = None,
    lease: float | None = None,
    retention: float | None = None,
    using: str | None = None,
) -> Callable[[F], F]:
    """Make a task function run its body at most once per key; put it under ``@shared_task``.

    ::

        @shared_task(acks_late=True, autoretry_for=(ConnectionError,), name="billing.apply")
        @idempotent_task(key="event_id", name="billing.apply")
        def apply_event(event_id: str, amount: int) -> dict:
            ...

    Args:
        key: the name of the task argument holding the idempotency key (an event id,
            an order number), or ``callable(*args, **kwargs) -> str``.
        principal: who the keys belong to (default ``"celery"``): a string, or
            ``callable(*args, **kwargs) -> str`` (per tenant, per sender).
        name: the task's name, for the endpoint ``"task:<name>"`` (default
            ``<module>.<function name>``, Celery's default task name). Pass the same
            ``name`` as to ``@shared_task`` when you give one.
        payload: ``callable(*args, **kwargs) -> JSON`` identifying the work (default:
            the arguments by name, without a bound task's ``self``); the same key
            with another payload raises ``exceptions.KeyReused``.
        lease: seconds a running body holds off duplicates (default ``LEASE``); set
            it above the task's longest run (or ``time_limit``): after it, a
            redelivered task takes over the key of a worker presumed dead.
        retention: seconds the return value is kept and returned (default
            ``RETENTION``); then the key is new again.
        using: the records' database alias (default: the router's choice).

    Raises (in the task):
        The errors of ``inbox.once``. ``exceptions.InFlight`` inside a worker becomes
        ``self.retry(countdown=<rest of the lease>)``, counted against the task's
        ``max_retries``.
    """

    def decorator(func: F) -> F:
        task_name = name or f"{func.__module__}.{func.__name__}"
        inner = idempotent_call(
            key=key,
            principal=principal,
            endpoint=f"task:{task_name}",
            payload=payload,
            lease=lease,
            retention=retention,
            using=using,
        )(func)

        @wraps(func)
        def task_body(*args: Any, **kwargs: Any) -> Any:
            try:
                with presence.entry_point("task"):
                    return inner(*args, **kwargs)
            except InFlight as exc:
                task = current_task
                wrapped = getattr(task, "__wrapped__", None)
                running = getattr(wrapped, "__func__", wrapped) is task_body and not getattr(
                    task.request, "called_directly", True
                )
                if not running:
                    raise
                raise task.retry(countdown=max(1, math.ceil(exc.retry_after)), exc=exc) from exc

        task_body._idempotency_endpoint = f"task:{task_name}"  # type: ignore[attr-defined]
        return task_body  # type: ignore[return-value]

    return decorator


def idempotent_shared_task(
    *,
    key: str | ArgsCallable,
    principal: str | ArgsCallable = DEFAULT_PRINCIPAL,
    payload: ArgsCallable | None = None,
    lease: float | None = None,
    retention: float | None = None,
    using: str | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """``@shared_task(**task_options)`` over ``@idempotent_task(...)``, names kept in step.

    ``task_options`` go to Celery's ``shared_task`` (``name``, ``acks_late``,
    ``autoretry_for``, ``bind``...); the endpoint is ``"task:<name>"``.
    """

    def decorator(func: Callable[..., Any]) -> Any:
        body = idempotent_task(
            key=key,
            principal=principal,
            name=task_options.get("name"),
            payload=payload,
            lease=lease,
            retention=retention,
            using=using,
        )(func)
        return shared_task(**task_options)(body)

    return decorator
