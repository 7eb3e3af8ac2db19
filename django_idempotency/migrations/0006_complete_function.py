"""The completion as a server-side function (docs/benchmarks.md).

Installs ``django_idempotency_complete(...)`` on PostgreSQL, for the plain and the
partitioned table: the fenced ``UPDATE`` planned once per session, raising (SQLSTATE
``DIF01``) when the fence matches no row. A completion can then carry its
transaction's ``COMMIT`` in the same round trip: a lost lease aborts the transaction
before that ``COMMIT`` runs. Processes that find no function (the code deployed before
this migration ran) keep the plain ``UPDATE`` and a ``COMMIT`` of its own.
"""

from django.db import migrations


def _hinted(**kwargs):
    return {"hints": {"model_name": "idempotencyrecord"}, "elidable": False, **kwargs}


def forwards(apps, schema_editor):
    from django_idempotency.store.schema import COMPLETE_FUNCTION, forget

    forget()
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # no parameters: the body has % signs
            cursor.execute(COMPLETE_FUNCTION)


def backwards(apps, schema_editor):
    from django_idempotency.store.schema import DROP_COMPLETE_FUNCTION, forget

    forget()
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(DROP_COMPLETE_FUNCTION)


class Migration(migrations.Migration):

    dependencies = [
        ("django_idempotency", "0005_owner_presence"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, **_hinted()),
    ]
