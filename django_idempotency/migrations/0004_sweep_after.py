"""Keep each record by its own retention window (docs/retention.md).

Adds ``sweep_after``: the end of the record's retention window as it was claimed,
never changed afterwards (``expires_at`` may move later: takeover, heartbeat, late
completion). On PostgreSQL with the partitioned table (migration 0003), the table is
rebuilt partitioned by ``sweep_after``, so a day's partition holds the records whose
windows end that day and is dropped about a day after they expire, whatever the other
views' windows are. Every row is copied. The plain table (and other databases) only
gets the column.
"""

import datetime as dt

from django.db import migrations, models


def _hinted(**kwargs):
    return {"hints": {"model_name": "idempotencyrecord"}, "elidable": False, **kwargs}


def fill(apps, schema_editor):
    from django_idempotency.store.schema import forget, is_partitioned

    forget()
    connection = schema_editor.connection
    if is_partitioned(connection):
        return  # repartition() fills it while copying
    model = apps.get_model("django_idempotency", "IdempotencyRecord")
    records = model.objects.using(connection.alias)
    # A window never ends before its lease (the sweeper relies on it).
    records.filter(state="claimed", lease_until__gt=models.F("expires_at")).update(
        expires_at=models.F("lease_until")
    )
    records.filter(sweep_after__isnull=True).update(sweep_after=models.F("expires_at"))


def repartition(apps, schema_editor, *, version):
    from django_idempotency.retention import partitions
    from django_idempotency import retention
    from django_idempotency.retention import sweeper
    from django_idempotency.store.schema import forget, is_partitioned

    forget()
    connection = schema_editor.connection
    if not is_partitioned(connection):
        return
    model = apps.get_model("django_idempotency", "IdempotencyRecord")
    partitions.to_plain(connection, schema_editor, model)
    # The plain table's indexes were deferred to the end of the migration: build them
    # now, before the partitioned table takes their names.
    for sql in schema_editor.deferred_sql:
        schema_editor.execute(sql)
    schema_editor.deferred_sql.clear()
    today = sweeper.store_now(connection).date()
    # The days a claim made now may need, as the sweeper would create them.
    days = [today + dt.timedelta(days=n) for n in range(sweeper.days_ahead() + 1)]
    partitions.to_partitioned(connection, keep_since=None, days=days, version=version)


def forwards(apps, schema_editor):
    fill(apps, schema_editor)
    repartition(apps, schema_editor, version=2)


def backwards(apps, schema_editor):
    repartition(apps, schema_editor, version=1)


class Migration(migrations.Migration):

    dependencies = [
        ("django_idempotency", "0003_partitioned_records"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="sweep_after",
            field=models.DateTimeField(null=True, verbose_name="sweep after"),
        ),
        migrations.RunPython(forwards, backwards, **_hinted()),
    ]
