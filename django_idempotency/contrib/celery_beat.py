"""The relay and the sweeper as django-celery-beat periodic tasks (docs/celery.md).

With django-celery-beat's database scheduler
(``celery beat --scheduler django_celery_beat.schedulers:DatabaseScheduler``), a
project's periodic tasks are ``PeriodicTask`` rows that operators see and change in the
admin. :func:`add_periodic_tasks` creates the two this app needs, once, and never
overwrites a row that exists (an operator's interval, arguments or ``enabled`` stay as
they are); :func:`remove_periodic_tasks` deletes them. Both take the ``(apps,
schema_editor)`` of a ``migrations.RunPython`` operation, so a project's data migration
can call them, and work outside migrations with no arguments::

    from django.db import migrations

    from django_idempotency.contrib.celery_beat import (
        add_periodic_tasks,
        remove_periodic_tasks,
    )

    class Migration(migrations.Migration):
        dependencies = [("django_celery_beat", "0019_alter_periodictasks_options")]
        operations = [migrations.RunPython(add_periodic_tasks, remove_periodic_tasks)]

Needs ``pip install django-idempotency[beat]`` and ``django_celery_beat`` in
``INSTALLED_APPS``. The tasks themselves are ``django_idempotency.tasks``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.apps import apps as global_apps
from django.db import router
from django.utils import timezone

from django_idempotency.outbox.kick import RELAY_TASK
from django_idempotency.retention.sweeper import SWEEP_TASK


@dataclass(frozen=True)
class PeriodicTaskSpec:
    """One periodic task as :func:`add_periodic_tasks` creates it.

    Attributes:
        name: the ``PeriodicTask``'s unique name, which identifies it from then on.
        task: the registered Celery task's name.
        every: seconds between runs (an ``IntervalSchedule`` of that many seconds).
        description: what the admin shows beside it.
    """

    name: str
    task: str
    every: int
    description: str


#: What :func:`add_periodic_tasks` creates by default: the relay every 10 s (a commit
#: that enqueues a message also starts it at once: the interval only bounds how late a
#: retried or missed message is handed out) and the sweeper every hour (docs/retention.md).
DEFAULT_TASKS = (
    PeriodicTaskSpec(
        "django-idempotency: outbox relay",
        RELAY_TASK,
        10,
        "Delivers the outbox messages that are due (django_idempotency.tasks.relay_outbox).",
    ),
    PeriodicTaskSpec(
        "django-idempotency: retention sweep",
        SWEEP_TASK,
        3600,
        "Drops or deletes expired idempotency records (django_idempotency.tasks.sweep).",
    ),
)


def add_periodic_tasks(
    apps: Any = None,
    schema_editor: Any = None,
    *,
    tasks: tuple[PeriodicTaskSpec, ...] = DEFAULT_TASKS,
) -> list[str]:
    """Create the relay's and the sweeper's ``PeriodicTask`` rows where they are missing.

    A row whose name exists is left exactly as it is (an operator may have changed its
    interval, arguments or disabled it); a missing one is created enabled, with an
    ``IntervalSchedule`` of ``every`` seconds (shared with any row of the same interval;
    the oldest of several equal ones, which nothing in django-celery-beat prevents).

    Args:
        apps: a migration's app registry (``RunPython`` passes it); ``None``: the
            project's own models.
        schema_editor: the migration's schema editor (``RunPython`` passes it): the
            rows are written on the database the migration runs on, and nothing is
            written where the database routers do not allow django_celery_beat's
            tables (``allow_migrate``). ``None``: on the database the routers choose
            for django_celery_beat's writes.
        tasks: what to create; by default :data:`DEFAULT_TASKS`.

    Returns:
        The names of the rows created (empty when every one existed, or the
        migration's database holds no django_celery_beat tables).

    Raises:
        LookupError: ``django_celery_beat`` is not in ``INSTALLED_APPS`` (or, in a
            migration, the migration does not depend on its migrations).
    """
    registry = apps or global_apps
    interval_model = registry.get_model("django_celery_beat", "IntervalSchedule")
    task_model = registry.get_model("django_celery_beat", "PeriodicTask")
    using = _database(task_model, schema_editor)
    if using is None:
        return []
    created: list[str] = []
    for spec in tasks:
        if task_model._default_manager.using(using).filter(name=spec.name).exists():
            continue
        # No unique constraint keeps two equal schedules apart (the admin can make a
        # second one): the oldest is shared, as django-celery-beat's own lookups do.
        schedules = interval_model._default_manager.using(using)
        interval = schedules.filter(every=spec.every, period="seconds").order_by("pk").first()
        if interval is None:
            interval = schedules.create(every=spec.every, period="seconds")
        task_model._default_manager.using(using).create(
            name=spec.name,
            task=spec.task,
            interval=interval,
            args=json.dumps([]),
            kwargs=json.dumps({}),
            enabled=True,
            description=spec.description,
        )
        created.append(spec.name)
    if created:
        _mark_changed(registry, using)
    return created


def remove_periodic_tasks(
    apps: Any = None,
    schema_editor: Any = None,
    *,
    tasks: tuple[PeriodicTaskSpec, ...] = DEFAULT_TASKS,
) -> int:
    """Delete the ``PeriodicTask`` rows :func:`add_periodic_tasks` creates, by name.

    Args:
        apps: a migration's app registry; ``None``: the project's own models.
        schema_editor: the migration's schema editor; its database is the one written,
            as for :func:`add_periodic_tasks`.
        tasks: whose rows to delete; by default :data:`DEFAULT_TASKS`.

    Returns:
        The number of rows deleted. Their interval schedules are kept (other tasks may
        share them).

    Raises:
        LookupError: ``django_celery_beat`` is not installed.
    """
    registry = apps or global_apps
    task_model = registry.get_model("django_celery_beat", "PeriodicTask")
    using = _database(task_model, schema_editor)
    if using is None:
        return 0
    names = [spec.name for spec in tasks]
    deleted = task_model._default_manager.using(using).filter(name__in=names).delete()[0]
    if deleted:
        _mark_changed(registry, using)
    return int(deleted)


def _database(task_model: Any, schema_editor: Any) -> str | None:
    """The database whose ``PeriodicTask`` rows are written; ``None``: none here.

    In a migration, the database it runs on, unless the database routers keep
    django_celery_beat's tables off it (``allow_migrate``: they do not exist there);
    outside one, where the routers send django_celery_beat's writes.
    """
    if schema_editor is None:
        return str(router.db_for_write(task_model))
    alias = str(schema_editor.connection.alias)
    return alias if router.allow_migrate_model(alias, task_model) else None


def _mark_changed(registry: Any, using: str) -> None:
    """Tell a running database scheduler to reload its rows.

    It compares the single ``PeriodicTasks`` row's ``last_update`` with what it read
    last; the real models' signals move it, a migration's historical models have none.
    """
    tracker = registry.get_model("django_celery_beat", "PeriodicTasks")
    tracker._default_manager.using(using).update_or_create(
        ident=1, defaults={"last_update": timezone.now()}
    )
