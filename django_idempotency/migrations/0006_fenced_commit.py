"""A completion that carries its transaction's COMMIT (docs/benchmarks.md).

Installs ``django_idempotency_fenced(updated, record)`` on PostgreSQL: it raises
(SQLSTATE ``DIF01``) unless the fenced ``UPDATE`` of a completion matched exactly one
row. The completion can then send ``UPDATE ...; COMMIT`` in one round trip: a lost
lease aborts the transaction before its ``COMMIT``. Processes started before this
migration ran keep completing in two round trips; nothing else changes.
"""

from django.db import migrations


def _hinted(**kwargs):
    return {"hints": {"model_name": "idempotencyrecord"}, "elidable": False, **kwargs}


def forwards(apps, schema_editor):
    from django_idempotency._pg_partitioned import FENCE_FUNCTION, forget

    forget()
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # no parameters: the body has % signs
            cursor.execute(FENCE_FUNCTION)


def backwards(apps, schema_editor):
    from django_idempotency._pg_partitioned import DROP_FENCE_FUNCTION, forget

    forget()
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(DROP_FENCE_FUNCTION)


class Migration(migrations.Migration):

    dependencies = [
        ("django_idempotency", "0005_owner_presence"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, **_hinted()),
    ]
