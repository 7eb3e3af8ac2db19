"""Owner presence (docs/robustness.md#owner-presence).

Adds ``owner_pid``: the PostgreSQL backend of the owner's session while that session
holds the record's presence lock (``NULL``: presence unknown, the lease alone decides).
Rows written before, and rows written by processes still running the previous release,
have none, so they are judged by their lease as before. On the partitioned table the
claim function gains its third version (``django_idempotency_claim`` with
``p_take``/``p_test``); version 2 is kept beside it for those processes, and reversing
the migration drops version 3 only.
"""

from django.db import migrations, models


def _hinted(**kwargs):
    return {"hints": {"model_name": "idempotencyrecord"}, "elidable": False, **kwargs}


def forwards(apps, schema_editor):
    from django_idempotency.store.schema import CLAIM_FUNCTION_V3, forget, is_partitioned

    forget()
    connection = schema_editor.connection
    if is_partitioned(connection):
        with connection.cursor() as cursor:  # no parameters: the body has % signs
            cursor.execute(CLAIM_FUNCTION_V3)


def backwards(apps, schema_editor):
    from django_idempotency.store.schema import DROP_CLAIM_FUNCTION_V3, forget

    forget()
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(DROP_CLAIM_FUNCTION_V3)


class Migration(migrations.Migration):

    dependencies = [
        ("django_idempotency", "0004_sweep_after"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="owner_pid",
            field=models.IntegerField(editable=False, null=True, verbose_name="owner session"),
        ),
        migrations.RunPython(forwards, backwards, **_hinted()),
    ]
