"""Partition the record table by day on PostgreSQL (docs/retention.md).

Database-only: the model state does not change, so ``makemigrations --check`` stays
clean, and SQLite (or any other backend) keeps the plain table. On PostgreSQL 14+
the table is converted unless ``IDEMPOTENCY["PARTITION_RECORDS"]`` is ``False`` when
this migration is applied; the store detects the table's kind per connection, so the
setting only matters at ``migrate`` time. To switch later, migrate
``django_idempotency 0002`` and back to this migration with the setting changed.

Every row is copied (a record inside its window or lease must never be lost); the
sweeper forgets what is past both. Migration 0004 then moves the table to partitions
by the day each record's window ends.
"""

import datetime as dt
import warnings

from django.db import migrations


def _days(connection):
    from django_idempotency import retention
    from django_idempotency.retention import sweeper
    from django_idempotency.conf import conf

    today = sweeper.store_now(connection).date()
    return [today + dt.timedelta(days=n) for n in range(max(conf.partitions_ahead, 0) + 1)]


def partition(apps, schema_editor):
    from django_idempotency.retention import partitions
    from django_idempotency.store.schema import forget, is_partitioned
    from django_idempotency.conf import conf

    forget()
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not conf.partition_records:
        return
    if connection.pg_version < partitions.MIN_SERVER_VERSION:
        warnings.warn(
            "django-idempotency: PostgreSQL 14 or later is needed to partition the "
            "record table; it stays a plain table (swept by batched deletes).",
            RuntimeWarning,
            stacklevel=1,
        )
        return
    if is_partitioned(connection):
        partitions.install_functions(connection, version=1)
        return
    partitions.to_partitioned(connection, keep_since=None, days=_days(connection), version=1)


def unpartition(apps, schema_editor):
    from django_idempotency.retention import partitions
    from django_idempotency.store.schema import forget, is_partitioned

    forget()
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not is_partitioned(connection):
        return
    model = apps.get_model("django_idempotency", "IdempotencyRecord")
    partitions.to_plain(connection, schema_editor, model)


class Migration(migrations.Migration):

    dependencies = [
        ("django_idempotency", "0002_outbox"),
    ]

    operations = [
        # The hints let a database router that routes by model skip this migration
        # on databases that do not hold the record table.
        migrations.RunPython(
            partition, unpartition, elidable=False, hints={"model_name": "idempotencyrecord"}
        ),
    ]
