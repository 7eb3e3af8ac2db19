"""The relay and the sweeper as django-celery-beat periodic tasks (database scheduler)."""

from __future__ import annotations

import datetime as dt
import json
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytest.importorskip(
    "django_celery_beat",
    reason="django-celery-beat is not installed (it supports Django < 6.1; make install "
    "adds it where it can)",
)

from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks
from django_celery_beat.schedulers import DatabaseScheduler

from django_idempotency import outbox, store, tasks
from django_idempotency.contrib.celery_beat import (
    DEFAULT_TASKS,
    RELAY_TASK,
    SWEEP_TASK,
    PeriodicTaskSpec,
    add_periodic_tasks,
    remove_periodic_tasks,
)
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.store.values import StoredResponse
from django_idempotency.testing import travel

RELAY, SWEEP = (spec.name for spec in DEFAULT_TASKS)


@pytest.fixture
def celery_app() -> Iterator[Any]:
    """An eager Celery app, current for the test: a scheduled task runs in the test."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("django-idempotency-beat", set_as_current=True)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, timezone="UTC")
    app.finalize()
    yield app
    previous.set_current()


@pytest.fixture
def received() -> Iterator[list[int]]:
    seen: list[int] = []
    outbox.register("beat.topic")(lambda message, key: seen.append(message.pk))
    yield seen
    outbox.unregister("beat.topic")


def run_due(scheduler: DatabaseScheduler, name: str) -> Any:
    """Apply the scheduler's entry ``name`` if it is due, as a beat tick does."""
    entry = scheduler.schedule[name]
    due, _next_in = entry.is_due()
    assert due, f"{name} is not due"
    return scheduler.apply_async(entry, producer=None)


def make_due(name: str) -> None:
    PeriodicTask.objects.filter(name=name).update(last_run_at=timezone.now() - dt.timedelta(days=2))
    PeriodicTasks.update_changed()


@pytest.mark.django_db
def test_adds_the_relay_and_the_sweeper_once_and_keeps_an_operators_changes():
    assert add_periodic_tasks() == [RELAY, SWEEP]
    relay = PeriodicTask.objects.get(name=RELAY)
    sweep = PeriodicTask.objects.get(name=SWEEP)
    assert (relay.task, relay.interval.every, relay.interval.period) == (RELAY_TASK, 10, "seconds")
    assert (sweep.task, sweep.interval.every) == (SWEEP_TASK, 3600)
    assert relay.enabled and json.loads(relay.kwargs) == {} and json.loads(relay.args) == []
    assert {RELAY_TASK, SWEEP_TASK} <= set(tasks.relay_outbox.app.tasks)  # registered names

    relay.enabled = False
    relay.kwargs = json.dumps({"max_batches": 3})
    relay.save()
    assert add_periodic_tasks() == []  # nothing created twice, nothing overwritten
    relay.refresh_from_db()
    assert not relay.enabled and json.loads(relay.kwargs) == {"max_batches": 3}
    assert PeriodicTask.objects.filter(task__startswith="django_idempotency.").count() == 2


@pytest.mark.django_db
def test_remove_deletes_only_the_apps_rows():
    add_periodic_tasks()
    other = PeriodicTask.objects.create(
        name="reports", task="shop.reports", interval=PeriodicTask.objects.get(name=RELAY).interval
    )
    assert remove_periodic_tasks() == 2
    assert list(PeriodicTask.objects.values_list("name", flat=True)) == [other.name]
    assert remove_periodic_tasks() == 0


@pytest.mark.django_db
def test_a_data_migration_adds_them_with_historical_models():
    historical = MigrationExecutor(connection).loader.project_state().apps
    editor = types.SimpleNamespace(connection=connection)
    before = PeriodicTasks.last_change()
    custom = (PeriodicTaskSpec("relay often", RELAY_TASK, 2, "the relay every 2 s"),)
    assert add_periodic_tasks(historical, editor, tasks=custom) == ["relay often"]
    assert PeriodicTask.objects.get(name="relay often").interval.every == 2
    assert PeriodicTasks.last_change() != before  # a running scheduler reloads
    assert remove_periodic_tasks(historical, editor, tasks=custom) == 1


@pytest.mark.django_db(transaction=True)
def test_the_database_scheduler_runs_the_relay_that_delivers(celery_app, received, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}  # only the schedule starts the relay
    add_periodic_tasks()
    with transaction.atomic():
        message = outbox.enqueue("beat.topic", {"n": 1})
    assert received == []
    make_due(RELAY)
    scheduler = DatabaseScheduler(app=celery_app)
    assert scheduler.schedule[RELAY].task == RELAY_TASK
    result = run_due(scheduler, RELAY)
    assert result.get() == 1
    assert received == [message.pk]
    assert OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SENT


@pytest.mark.django_db(transaction=True)
def test_the_database_scheduler_runs_the_sweep_that_removes_expired_records(celery_app):
    scope = store.Scope("auth.user:1", "POST /jobs", str(uuid.uuid4()))
    won = store.claim(scope, "f" * 64, lease=30.0, retention=60.0)
    assert isinstance(won, store.Claim)
    store.complete(won, StoredResponse(201, [], b"{}"))
    add_periodic_tasks()
    with travel(3 * 86400):
        make_due(SWEEP)
        scheduler = DatabaseScheduler(app=celery_app)
        report = run_due(scheduler, SWEEP).get()
    assert not IdempotencyRecord.objects.filter(pk=won.record_id).exists()
    assert isinstance(report, dict) and "error" not in report


@pytest.mark.django_db(transaction=True)
def test_the_documented_beat_schedule_becomes_rows_of_the_database_scheduler(celery_app):
    celery_app.conf.beat_schedule = {
        "idempotency-relay": {"task": "django_idempotency.relay_outbox", "schedule": 10.0},
        "idempotency-sweep": {"task": "django_idempotency.sweep", "schedule": 3600.0},
    }
    DatabaseScheduler(app=celery_app)
    rows = dict(PeriodicTask.objects.values_list("name", "task"))
    assert rows["idempotency-relay"] == RELAY_TASK and rows["idempotency-sweep"] == SWEEP_TASK


@pytest.mark.django_db
def test_w004_looks_for_the_sweeper_among_the_periodic_tasks():
    from django.test import override_settings

    from django_idempotency.checks.settings import (
        check_sweeper_scheduled,
        check_sweeper_scheduled_in_database,
    )

    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE={}):
        assert check_sweeper_scheduled() == []  # the schedule is in the database
        (missing,) = check_sweeper_scheduled_in_database(databases=["default"])
        assert missing.id == "django_idempotency.W004"
        add_periodic_tasks()
        assert check_sweeper_scheduled_in_database(databases=["default"]) == []
        PeriodicTask.objects.filter(task=SWEEP_TASK).update(enabled=False)
        assert len(check_sweeper_scheduled_in_database(databases=["default"])) == 1


class BeatOnShard:
    """A project's router: django_celery_beat's rows live on the ``shard`` database."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "shard" if model._meta.app_label == "django_celery_beat" else None

    db_for_write = db_for_read


class NeedsARequest:
    """A router that cannot answer without a request's context (a tenant's, say)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        raise LookupError("no tenant is active")


@pytest.mark.django_db(databases=["default", "shard"])
def test_w004_looks_where_the_routers_send_django_celery_beats_reads(settings):
    """The sweeper's row on the database the routers send django_celery_beat's reads to
    satisfies W004 whichever database ``check --database`` names; when it is missing
    there, the hint says where W004 looked."""
    from django_idempotency.checks.settings import check_sweeper_scheduled_in_database

    settings.DEBUG, settings.CELERY_BEAT_SCHEDULE = False, {}
    settings.DATABASE_ROUTERS = [BeatOnShard()]
    assert add_periodic_tasks() == [RELAY, SWEEP]  # written where the routers say
    assert PeriodicTask.objects.using("shard").filter(task=SWEEP_TASK).exists()
    assert not PeriodicTask.objects.using("default").exists()
    assert check_sweeper_scheduled_in_database(databases=["default"]) == []
    PeriodicTask.objects.using("shard").filter(task=SWEEP_TASK).update(enabled=False)
    (missing,) = check_sweeper_scheduled_in_database(databases=["default"])
    assert missing.id == "django_idempotency.W004"
    assert "in the 'shard' database, where the database routers send" in missing.hint


@pytest.mark.django_db(databases="__all__")
def test_w004_looks_in_every_database_when_the_routers_cannot_say(settings):
    from django_idempotency.checks.settings import check_sweeper_scheduled_in_database

    settings.DEBUG, settings.CELERY_BEAT_SCHEDULE = False, {}
    settings.DATABASE_ROUTERS = [NeedsARequest()]
    (missing,) = check_sweeper_scheduled_in_database(databases=["default"])
    assert "in every database ('default', " in missing.hint and "'shard'" in missing.hint
    on_shard = types.SimpleNamespace(connection=connections["shard"])
    add_periodic_tasks(MigrationExecutor(connection).loader.project_state().apps, on_shard)
    assert check_sweeper_scheduled_in_database(databases=["default"]) == []


@pytest.mark.django_db(databases=["default", "shard"])
def test_a_data_migration_run_on_another_database_writes_there():
    historical = MigrationExecutor(connection).loader.project_state().apps
    on_shard = types.SimpleNamespace(connection=connections["shard"])
    assert add_periodic_tasks(historical, on_shard) == [RELAY, SWEEP]
    assert set(PeriodicTask.objects.using("shard").values_list("name", flat=True)) == {RELAY, SWEEP}
    assert not PeriodicTask.objects.using("default").exists()
    assert remove_periodic_tasks(historical, on_shard) == 2


@pytest.mark.django_db
def test_a_data_migration_skips_a_database_without_django_celery_beats_tables(settings):
    """``RunPython`` runs on every database ``migrate`` is run on; where the routers keep
    django_celery_beat away, its tables do not exist and nothing is written."""

    class BeatElsewhere:
        def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
            return db != "default" if app_label == "django_celery_beat" else None

    settings.DATABASE_ROUTERS = [BeatElsewhere()]
    historical = MigrationExecutor(connection).loader.project_state().apps
    editor = types.SimpleNamespace(connection=connection)
    assert add_periodic_tasks(historical, editor) == []
    assert remove_periodic_tasks(historical, editor) == 0
    assert not PeriodicTask.objects.exists()


@pytest.mark.django_db
def test_equal_interval_schedules_do_not_fail_the_data_migration():
    """django-celery-beat has no unique constraint on an interval (the admin makes a
    second equal one): the tasks share the oldest."""
    historical = MigrationExecutor(connection).loader.project_state().apps
    editor = types.SimpleNamespace(connection=connection)
    oldest = IntervalSchedule.objects.create(every=3600, period=IntervalSchedule.SECONDS)
    IntervalSchedule.objects.create(every=3600, period=IntervalSchedule.SECONDS)
    assert add_periodic_tasks(historical, editor) == [RELAY, SWEEP]
    assert PeriodicTask.objects.get(name=SWEEP).interval_id == oldest.pk
    assert IntervalSchedule.objects.filter(every=3600).count() == 2
