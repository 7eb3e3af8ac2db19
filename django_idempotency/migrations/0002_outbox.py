import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

from django_idempotency._compat import check_constraint


class Migration(migrations.Migration):

    dependencies = [
        ('django_idempotency', '0001_initial'),
    ]

    operations = [
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
    ]
