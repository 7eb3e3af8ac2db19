"""The server-side functions, trigger and locks of the record table (docs/retention.md).

A unique index on a partitioned table must contain the partition key, so the
(principal, endpoint, key) uniqueness of a record cannot be a unique index there. It
is enforced by one rule that every writer follows: hold a transaction-scoped advisory
lock on a hash of the scope, then look the scope up (a fresh snapshot, READ
COMMITTED), then insert. Two server-side functions apply it:

* ``django_idempotency_claim(...)``: the claim, one statement and one round trip: it
  inserts, or returns the facts of the record that holds the key. (A record past its
  retention window is deleted by the store, then claimed anew: the partition key is
  never rewritten.)
* ``django_idempotency_record_scope_unique()``: a ``BEFORE INSERT OR UPDATE OF
  principal, endpoint, key`` trigger applying the same rule to every other writer (the
  ORM, a psql session), raising ``unique_violation`` like the constraint it replaces.
  Rows inserted by the claim carry its owner token in a transaction-local setting and
  skip the second check.

Partitions are named ``django_idempotency_record_pYYYYMMDD`` and hold one UTC day of
``sweep_after`` (the day each record's own retention window ends); a record of a day
that has no partition yet goes to the default partition, ``DEFAULT_PARTITION``, until
the sweeper moves it into its day (``tables.create_day``). No claim runs DDL.
``django_idempotency_complete(...)`` is the fenced completion, on the plain and the
partitioned table alike.
"""

from __future__ import annotations

from django_idempotency.store.sql import PRESENCE_SEED, TABLE, owner_gone

#: Partition names: ``PARTITION_PREFIX`` + ``YYYYMMDD`` (UTC day of ``sweep_after``).
PARTITION_PREFIX = f"{TABLE}_p"


#: The default partition: the records of every day that has no partition of its own.
DEFAULT_PARTITION = f"{TABLE}_default"


#: First key of the two-integer advisory locks: the sweeper's lock (transaction-scoped) is
#: ``(LOCK_NAMESPACE, 1)``. (Scope locks use the one-bigint form, a separate key space.)
LOCK_NAMESPACE = 1768187245  # "idem"


SWEEP_LOCK = (LOCK_NAMESPACE, 1)


#: First key of a tenant schema's sweeper lock (transaction-scoped); the second is
#: ``hashtext(schema name)`` (docs/tenants.md).
SCHEMA_SWEEP_LOCK = LOCK_NAMESPACE + 2


#: Seed of ``hashtextextended`` for the scope's advisory lock.
_SCOPE_SEED = 7310034283826791680
_SCOPE_LOCK = (
    "pg_advisory_xact_lock(hashtextextended("
    "{p}principal || chr(31) || {p}endpoint || chr(31) || {p}key, "
    f"{_SCOPE_SEED}))"
)


#: The presence lock key of the scope (same as ``sql.presence_key`` on the arguments).
_PRESENCE_LOCK_KEY = (
    f"hashtextextended(p_principal || chr(31) || p_endpoint || chr(31) || p_key, {PRESENCE_SEED})"
)


# The lookup must see every row committed before the lock was granted: only READ
# COMMITTED takes a new snapshot per statement.
_READ_COMMITTED_ONLY = """
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'django-idempotency: writes to the partitioned record table need '
            'READ COMMITTED transactions, not %', current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use READ COMMITTED (Django''s default) for the idempotency '
                         'database, or keep the plain table: see docs/retention.md.';
    END IF;"""


#: The record table's ``fillfactor`` (percent): each page keeps a quarter free when rows
#: are inserted, so the completion, which writes the response into the row the claim
#: inserted, finds room for the new row version on the same page and is a HOT update
#: (no new entry in any of the four indexes). A completed row is at most about 2 KB in
#: the page (larger values are compressed or moved to TOAST), a quarter of 8 KB
#: (docs/retention.md#storage-parameters).
RECORD_FILLFACTOR = 75


#: The claim: one statement, one round trip (``PG_PARTITIONED_CLAIM_SQL`` calls it). It
#: inserts a claim, or returns the facts of the record that holds the key, as the plain
#: table's ``PG_CLAIM_SQL`` does (``store.claims.judge`` decides what they mean); a day
#: without a partition of its own lands in the default partition. Every timestamp is
#: taken after the scope lock was granted, so a claim that waited never starts with a
#: spent lease. ``p_take``: this session may hold the record's presence lock (a direct
#: connection); the new owner then holds it (``present``) and its pid is stored in
#: ``owner_pid``. ``p_test``: whether ``owner_gone`` may be tested
#: (``sql.owner_gone``).
CLAIM_FUNCTION = f"""
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
    v_row {TABLE}%ROWTYPE;
    v_id bigint;
    v_pid integer;
    v_presence bigint := {_PRESENCE_LOCK_KEY};
BEGIN{_READ_COMMITTED_ONLY}
    -- 1. Serialise every writer of this scope until this transaction ends.
    PERFORM {_SCOPE_LOCK.format(p="p_")};
    v_now := clock_timestamp() + p_clock_offset * interval '1 second';
    -- 2. Look it up (a new snapshot: every row committed by an earlier holder).
    SELECT * INTO v_row FROM {TABLE} r
    WHERE r.principal = p_principal AND r.endpoint = p_endpoint AND r.key = p_key;
    IF FOUND THEN
        RETURN QUERY SELECT false, v_row.id, v_row.owner_token, v_row.state,
            v_row.fingerprint, v_row.recovery_point,
            EXTRACT(EPOCH FROM v_row.lease_until - v_now)::float8,
            v_row.expires_at <= v_now, v_row.response_status::integer,
            v_row.response_headers, v_row.response_body, v_row.owner_pid, false,
            {owner_gone("v_row.", test="p_test", now="v_now")},
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
    INSERT INTO {TABLE} AS r (
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


SCOPE_TRIGGER_FUNCTION = f"""
CREATE OR REPLACE FUNCTION django_idempotency_record_scope_unique()
RETURNS trigger LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF NEW.owner_token::text = current_setting('django_idempotency.claim_token', true) THEN
        RETURN NEW;  -- inserted by django_idempotency_claim(), checked under the lock
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.principal = OLD.principal AND NEW.endpoint = OLD.endpoint
       AND NEW.key = OLD.key THEN
        RETURN NEW;
    END IF;{_READ_COMMITTED_ONLY}
    PERFORM {_SCOPE_LOCK.format(p="NEW.")};
    IF EXISTS (SELECT 1 FROM {TABLE} r
               WHERE r.principal = NEW.principal AND r.endpoint = NEW.endpoint
                 AND r.key = NEW.key AND r.id <> NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "%"',
            '{TABLE}_scope_uniq'
            USING ERRCODE = 'unique_violation', CONSTRAINT = '{TABLE}_scope_uniq',
                  TABLE = '{TABLE}',
                  DETAIL = 'Key (principal, endpoint, key) already exists.';
    END IF;
    RETURN NEW;
END
$fn$;
"""


SCOPE_TRIGGER = f"""
CREATE TRIGGER {TABLE}_scope_unique
BEFORE INSERT OR UPDATE OF principal, endpoint, key ON {TABLE}
FOR EACH ROW EXECUTE FUNCTION django_idempotency_record_scope_unique()
"""


#: The fenced completion as a server-side function, on the
#: plain and the partitioned table alike. Its statement is planned once per session
#: (``plan_cache_mode = force_generic_plan``) instead of on every call, and it raises
#: ``FENCED_SQLSTATE`` when the fence matches no row (a lost lease: the caller's
#: transaction rolls back). ``p_unlock``: the presence lock to release
#: once the row is updated (locked), or ``NULL``; it is released before the function
#: raises too (an unlock is not undone by the rollback that follows).
COMPLETE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION django_idempotency_complete(
    p_id bigint, p_token uuid, p_status integer, p_headers jsonb, p_body bytea,
    p_grace float8, p_clock_offset float8, p_unlock bigint
) RETURNS integer LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_now timestamptz := statement_timestamp() + p_clock_offset * interval '1 second';
    v_updated bigint;
BEGIN
    UPDATE {TABLE} r SET state = 'completed', response_status = p_status,
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


#: What :data:`COMPLETE_FUNCTION` is called, to drop it and to find it.
COMPLETE_SIGNATURE = (
    "django_idempotency_complete(bigint, uuid, integer, jsonb, bytea, float8, float8, bigint)"
)


#: The functions of the partitioned table, dropped with it (the completion stays).
DROP_PARTITION_FUNCTIONS = [
    "DROP FUNCTION IF EXISTS django_idempotency_claim("
    "varchar, varchar, varchar, varchar, uuid, float8, float8, float8, boolean, boolean, "
    "varchar)",
    "DROP FUNCTION IF EXISTS django_idempotency_record_scope_unique()",
]
