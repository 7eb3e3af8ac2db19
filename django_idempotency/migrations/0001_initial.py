"""The record table, the outbox, and on PostgreSQL the record table's functions.

On PostgreSQL 14+ the record table is then partitioned by day (docs/retention.md)
unless ``IDEMPOTENCY["PARTITION_RECORDS"]`` is ``False`` when this migration is
applied; the store detects the table's kind per connection, so the setting only
matters at ``migrate`` time. The SQL comes from ``django_idempotency.store.schema``,
which exists for the migrations.
"""

import django
import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
import uuid
from django.db import migrations, models


def check_constraint(condition, name):
    # ``condition=`` from Django 5.1 on, ``check=`` before.
    keyword = "condition" if django.VERSION >= (5, 1) else "check"
    return models.CheckConstraint(name=name, **{keyword: condition})


def install(apps, schema_editor):
    from django_idempotency.store.schema import tables

    # The tables' indexes were deferred to the end of the migration: build them now,
    # before the partitioned table takes their names.
    for sql in schema_editor.deferred_sql:
        schema_editor.execute(sql)
    schema_editor.deferred_sql.clear()
    tables.install(schema_editor.connection)


def uninstall(apps, schema_editor):
    from django_idempotency.store.schema import tables

    tables.uninstall(schema_editor.connection)


class Migration(migrations.Migration):

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name='IdempotencyRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('principal', models.CharField(max_length=255, verbose_name='principal')),
                ('endpoint', models.CharField(max_length=255, verbose_name='endpoint')),
                ('request_path', models.CharField(blank=True, default='', max_length=255, null=True, verbose_name='request path')),
                ('key', models.CharField(max_length=255, verbose_name='idempotency key')),
                ('fingerprint', models.CharField(max_length=160, verbose_name='fingerprint')),
                ('state', models.CharField(choices=[('claimed', 'claimed'), ('completed', 'completed')], default='claimed', max_length=16, verbose_name='state')),
                ('owner_token', models.UUIDField(default=uuid.uuid4, verbose_name='owner token')),
                ('lease_until', models.DateTimeField(verbose_name='lease until')),
                ('recovery_point', models.CharField(blank=True, max_length=64, verbose_name='recovery point')),
                ('response_status', models.PositiveSmallIntegerField(null=True, verbose_name='response status')),
                ('response_headers', models.JSONField(default=list, verbose_name='response headers')),
                ('response_body', models.BinaryField(null=True, verbose_name='response body')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('completed_at', models.DateTimeField(null=True, verbose_name='completed at')),
                ('expires_at', models.DateTimeField(verbose_name='expires at')),
                ('sweep_after', models.DateTimeField(null=True, verbose_name='sweep after')),
                ('owner_pid', models.IntegerField(editable=False, null=True, verbose_name='owner session')),
            ],
            options={
                'verbose_name': 'idempotency record',
                'verbose_name_plural': 'idempotency records',
                'db_table': 'django_idempotency_record',
                'indexes': [models.Index(fields=['expires_at'], name='django_idem_record_expires'), models.Index(fields=['created_at'], name='django_idem_record_created')],
                'constraints': [models.UniqueConstraint(fields=('principal', 'endpoint', 'key'), name='django_idempotency_record_scope_uniq'), check_constraint(models.Q(('state__in', ['claimed', 'completed'])), 'django_idempotency_record_state_valid'), check_constraint(models.Q(('state', 'claimed'), ('response_status__isnull', False), _connector='OR'), 'django_idempotency_record_completed_has_response')],
            },
        ),
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('topic', models.CharField(max_length=255, verbose_name='topic')),
                ('payload', models.JSONField(default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder, verbose_name='payload')),
                ('dedup_key', models.CharField(max_length=255, verbose_name='dedup key')),
                ('state', models.CharField(choices=[('pending', 'pending'), ('sent', 'sent'), ('dead', 'dead')], default='pending', max_length=16, verbose_name='state')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('available_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='available at')),
                ('last_error', models.TextField(blank=True, verbose_name='last error')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('sent_at', models.DateTimeField(blank=True, null=True, verbose_name='sent at')),
                ('record', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='outbox_messages', to='django_idempotency.idempotencyrecord', verbose_name='idempotency record')),
            ],
            options={
                'verbose_name': 'outbox message',
                'verbose_name_plural': 'outbox messages',
                'db_table': 'django_idempotency_outbox',
                'indexes': [models.Index(condition=models.Q(('state', 'pending')), fields=['available_at', 'id'], name='django_idem_outbox_due'), models.Index(condition=models.Q(('state', 'sent')), fields=['sent_at'], name='django_idem_outbox_sent')],
                'constraints': [models.UniqueConstraint(fields=('topic', 'dedup_key'), name='django_idempotency_outbox_dedup_uniq'), check_constraint(models.Q(('state__in', ['pending', 'sent', 'dead'])), 'django_idempotency_outbox_state_valid')],
            },
        ),
        # The hints let a database router that routes by model skip this step on
        # databases that do not hold the record table.
        migrations.RunPython(
            install, uninstall, elidable=False, hints={"model_name": "idempotencyrecord"}
        ),
    ]
