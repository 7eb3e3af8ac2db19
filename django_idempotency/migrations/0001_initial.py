
import django.utils.timezone
import uuid
from django.db import migrations, models

from django_idempotency._compat import check_constraint


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='IdempotencyRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('principal', models.CharField(max_length=255, verbose_name='principal')),
                ('endpoint', models.CharField(max_length=255, verbose_name='endpoint')),
                ('key', models.CharField(max_length=255, verbose_name='idempotency key')),
                ('fingerprint', models.CharField(max_length=64, verbose_name='fingerprint')),
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
            ],
            options={
                'verbose_name': 'idempotency record',
                'verbose_name_plural': 'idempotency records',
                'db_table': 'django_idempotency_record',
                'indexes': [models.Index(fields=['expires_at'], name='django_idem_record_expires'), models.Index(fields=['created_at'], name='django_idem_record_created')],
                'constraints': [models.UniqueConstraint(fields=('principal', 'endpoint', 'key'), name='django_idempotency_record_scope_uniq'), check_constraint(models.Q(('state__in', ['claimed', 'completed'])), 'django_idempotency_record_state_valid'), check_constraint(models.Q(('state', 'claimed'), ('response_status__isnull', False), _connector='OR'), 'django_idempotency_record_completed_has_response')],
            },
        ),
    ]
