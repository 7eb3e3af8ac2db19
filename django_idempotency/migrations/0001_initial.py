"""The record table, the outbox, and on PostgreSQL the record table's functions.

On PostgreSQL 14+ the record table is then partitioned by day (docs/retention.md)
unless ``IDEMPOTENCY["PARTITION_RECORDS"]`` is ``False`` when this migration is
applied; the store detects the table's kind per connection, so the setting only
matters at ``migrate`` time. The tables' DDL comes from
``django_idempotency.store.schema``; the server-side functions are frozen here, as this
migration installs them: a version that changes one adds a migration with its new text
(the test suite checks that the latest migration's text of each is the code's).
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


# The server-side functions this migration installs (PostgreSQL), frozen.
COMPLETE_FUNCTION = """
CREATE OR REPLACE FUNCTION django_idempotency_complete(
    p_id bigint, p_token uuid, p_status integer, p_headers jsonb, p_body bytea,
    p_grace float8, p_clock_offset float8, p_unlock bigint
) RETURNS integer LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_now timestamptz := statement_timestamp() + p_clock_offset * interval '1 second';
    v_updated bigint;
BEGIN
    UPDATE django_idempotency_record r SET state = 'completed', response_status = p_status,
        response_headers = p_headers, response_body = p_body, completed_at = v_now,
        lease_until = v_now,
        expires_at = GREATEST(r.expires_at, v_now + p_grace * interval '1 second')
    WHERE r.id = p_id AND r.owner_token = p_token AND r.state = 'claimed';
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    IF p_unlock IS NOT NULL THEN  -- after the UPDATE locked the row; kept if we raise
        PERFORM pg_advisory_unlock(p_unlock);
    END IF;
    IF v_updated <> 1 THEN
        RAISE EXCEPTION 'idempotency record % was fenced off: its lease was lost before '
            'completion', p_id USING ERRCODE = 'DIF01';
    END IF;
    RETURN 1;
END
$fn$;
"""

CLAIM_FUNCTION = """
CREATE OR REPLACE FUNCTION django_idempotency_claim(
    p_principal varchar, p_endpoint varchar, p_key varchar, p_fingerprint varchar,
    p_token uuid, p_lease float8, p_retention float8, p_clock_offset float8,
    p_take boolean, p_test boolean, p_request_path varchar
) RETURNS TABLE (
    won boolean, id bigint, owner_token uuid, state varchar, fingerprint varchar,
    recovery_point varchar, lease_remaining float8, expired boolean,
    response_status integer, response_headers jsonb, response_body bytea,
    owner_pid integer, present boolean, owner_gone boolean, ended_by_operator boolean,
    age_seconds float8, window_seconds float8
) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_expires timestamptz;
    v_row django_idempotency_record%ROWTYPE;
    v_id bigint;
    v_pid integer;
    v_presence bigint := hashtextextended(p_principal || chr(31) || p_endpoint || chr(31) || p_key, 5211797480323874816);
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'django-idempotency: writes to the partitioned record table need '
            'READ COMMITTED transactions, not %', current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use READ COMMITTED (Django''s default) for the idempotency '
                         'database, or keep the plain table: see docs/retention.md.';
    END IF;
    -- 1. Serialise every writer of this scope until this transaction ends.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_principal || chr(31) || p_endpoint || chr(31) || p_key, 7310034283826791680));
    v_now := clock_timestamp() + p_clock_offset * interval '1 second';
    -- 2. Look it up (a new snapshot: every row committed by an earlier holder).
    SELECT * INTO v_row FROM django_idempotency_record r
    WHERE r.principal = p_principal AND r.endpoint = p_endpoint AND r.key = p_key;
    IF FOUND THEN
        RETURN QUERY SELECT false, v_row.id, v_row.owner_token, v_row.state,
            v_row.fingerprint, v_row.recovery_point,
            EXTRACT(EPOCH FROM v_row.lease_until - v_now)::float8,
            v_row.expires_at <= v_now, v_row.response_status::integer,
            v_row.response_headers, v_row.response_body, v_row.owner_pid, false,
            CASE WHEN p_test AND v_row.state = 'claimed' AND v_row.lease_until > v_now AND v_row.owner_pid IS NOT NULL AND v_row.owner_pid <> pg_backend_pid() THEN pg_try_advisory_xact_lock(hashtextextended(v_row.principal || chr(31) || v_row.endpoint || chr(31) || v_row.key, 5211797480323874816)) ELSE false END,
            v_row.lease_until = v_row.created_at,
            EXTRACT(EPOCH FROM v_now - v_row.created_at)::float8,
            EXTRACT(EPOCH FROM v_row.expires_at - v_row.created_at)::float8;
        RETURN;
    END IF;
    -- 3. Insert (into the day partition the window ends in, or the default partition).
    v_expires := v_now + GREATEST(p_retention, p_lease) * interval '1 second';
    -- The presence lock, transaction-level first: it goes with this transaction if
    -- anything below fails; the session-level hold is taken once the row is in.
    v_pid := CASE WHEN p_take AND pg_try_advisory_xact_lock(v_presence)
                  THEN pg_backend_pid() END;
    PERFORM set_config('django_idempotency.claim_token', p_token::text, true);
    INSERT INTO django_idempotency_record AS r (
        principal, endpoint, key, fingerprint, state, owner_token, lease_until,
        recovery_point, response_headers, created_at, expires_at, sweep_after, owner_pid,
        request_path)
    VALUES (
        p_principal, p_endpoint, p_key, p_fingerprint, 'claimed', p_token,
        v_now + p_lease * interval '1 second', '', '[]'::jsonb, v_now, v_expires, v_expires,
        v_pid, p_request_path)
    RETURNING r.id INTO v_id;
    IF v_pid IS NOT NULL THEN
        PERFORM pg_advisory_lock(v_presence);  -- held already: no wait
    END IF;
    RETURN QUERY SELECT true, v_id, NULL::uuid, NULL::varchar, NULL::varchar,
        ''::varchar, NULL::float8, NULL::boolean, NULL::integer, NULL::jsonb,
        NULL::bytea, v_pid, v_pid IS NOT NULL, false, false, NULL::float8, NULL::float8;
END
$fn$;
"""

SCOPE_TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION django_idempotency_record_scope_unique()
RETURNS trigger LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF NEW.owner_token::text = current_setting('django_idempotency.claim_token', true) THEN
        RETURN NEW;  -- inserted by django_idempotency_claim(), checked under the lock
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.principal = OLD.principal AND NEW.endpoint = OLD.endpoint
       AND NEW.key = OLD.key THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'django-idempotency: writes to the partitioned record table need '
            'READ COMMITTED transactions, not %', current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use READ COMMITTED (Django''s default) for the idempotency '
                         'database, or keep the plain table: see docs/retention.md.';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(NEW.principal || chr(31) || NEW.endpoint || chr(31) || NEW.key, 7310034283826791680));
    IF EXISTS (SELECT 1 FROM django_idempotency_record r
               WHERE r.principal = NEW.principal AND r.endpoint = NEW.endpoint
                 AND r.key = NEW.key AND r.id <> NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "%"',
            'django_idempotency_record_scope_uniq'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'django_idempotency_record_scope_uniq',
                  TABLE = 'django_idempotency_record',
                  DETAIL = 'Key (principal, endpoint, key) already exists.';
    END IF;
    RETURN NEW;
END
$fn$;
"""


def install(apps, schema_editor):
    from django_idempotency.store.schema import tables

    # The tables' indexes were deferred to the end of the migration: build them now,
    # before the partitioned table takes their names.
    for sql in schema_editor.deferred_sql:
        schema_editor.execute(sql)
    schema_editor.deferred_sql.clear()
    tables.install(
        schema_editor.connection,
        complete=COMPLETE_FUNCTION,
        partitioned=(CLAIM_FUNCTION, SCOPE_TRIGGER_FUNCTION),
    )


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
