"""PostgreSQL statements of the store, kept apart so ``store.py`` reads as protocol.

``NOW`` below is the database's clock plus the test offset (``clock.py``); every
statement takes it as ``%(clock_offset)s`` seconds.
"""

from __future__ import annotations

from django_idempotency.store import clock

_NOW = "(statement_timestamp() + %(clock_offset)s * interval '1 second')"
#: The record table (``IdempotencyRecord``'s ``db_table``), named here once for every
#: statement of the store and the schema.
TABLE = "django_idempotency_record"
#: The end of a new claim's retention window: never before its lease ends.
_WINDOW_END = f"{_NOW} + GREATEST(%(retention)s, %(lease)s) * interval '1 second'"
#: A collided record's age (seconds since its claim) and its retention window's length
#: (seconds from its claim to ``expires_at``), for the replay-age metric.
_AGE = f"EXTRACT(EPOCH FROM {_NOW} - created_at)::float8"
_WINDOW = "EXTRACT(EPOCH FROM expires_at - created_at)::float8"

#: Seed of ``hashtextextended`` for a record's presence lock: a session-level advisory
#: lock (one-bigint form) the owner's session holds from its claim to its completion
#: or release (docs/robustness.md#owner-presence). The partitioned table's scope lock
#: uses the same form with another seed, so the two never meet.
PRESENCE_SEED = 5211797480323874816


def presence_key(prefix: str = "") -> str:
    """SQL of a scope's presence lock key: parameters (``prefix=""``) or columns."""
    if prefix == "":
        parts = "%(principal)s || chr(31) || %(endpoint)s || chr(31) || %(key)s"
    else:
        parts = f"{prefix}principal || chr(31) || {prefix}endpoint || chr(31) || {prefix}key"
    return f"hashtextextended({parts}, {PRESENCE_SEED})"


_KEY = presence_key()
#: The owner's pid when this session may hold the presence lock: it takes a
#: transaction-level lock first (released with the statement's transaction, so a
#: statement that ends up not owning the record keeps nothing), then the session lock
#: once the row is surely its own (reentrant: it cannot wait).
_TAKE = f"CASE WHEN %(take)s AND pg_try_advisory_xact_lock({_KEY}) THEN pg_backend_pid() END"
_HOLD = f"CASE WHEN owner_pid IS NOT NULL THEN pg_try_advisory_lock({_KEY}) ELSE false END"


def owner_gone(prefix: str = "", *, test: str = "%(test)s", now: str = _NOW) -> str:
    """SQL of the fact "the record's owner is gone": its presence lock is free.

    True for a record claimed with a live lease whose owner's session held the
    presence lock (``owner_pid``, another session than this one) when that lock can be
    taken now: a live owner releases it only in the statement that completes or
    releases the claim (which locks and changes the row: the takeover's fence and
    ``SKIP LOCKED`` see that), so otherwise its session has ended
    (docs/robustness.md#owner-presence). The test takes the lock at
    transaction level, so a statement that finds the owner gone holds it until its
    transaction ends. ``test``: SQL of whether this connection may test presence
    (``presence.tests``); ``prefix``: the record's columns' (``""``, ``"v_row."``).
    """
    return (
        f"CASE WHEN {test} AND {prefix}state = 'claimed' AND {prefix}lease_until > {now} "
        f"AND {prefix}owner_pid IS NOT NULL AND {prefix}owner_pid <> pg_backend_pid() "
        f"THEN pg_try_advisory_xact_lock({presence_key(prefix)}) ELSE false END"
    )


#: The claim: one statement, one round trip.
#:
#: The INSERT either creates the row, and the first SELECT returns it (``won``), or
#: hits the unique constraint and does nothing; then the last SELECT returns the facts
#: of the row that holds the key (``owner_gone``: :func:`owner_gone`), so a replay, a 409
#: or a 422 costs this one statement too; ``store.claims.judge`` decides what they mean.
#: When the colliding row committed after this statement's snapshot was taken, no
#: SELECT returns a row and the caller asks again. ``waited`` is how long the INSERT
#: queued behind an uncommitted row with the same scope (one whose transaction then
#: rolled back): the store stamps such a claim again (``PG_RESTAMP_SQL``), since its
#: times were taken when the statement started. ``present``: the new owner's session
#: holds the presence lock (the caller must release it).
PG_CLAIM_SQL = f"""
WITH claimed AS (
    INSERT INTO {TABLE} (
        principal, endpoint, key, fingerprint, state, owner_token, lease_until,
        recovery_point, response_headers, created_at, expires_at, sweep_after, owner_pid,
        request_path
    )
    VALUES (
        %(principal)s, %(endpoint)s, %(key)s, %(fingerprint)s, 'claimed', %(token)s,
        {_NOW} + %(lease)s * interval '1 second', '', '[]'::jsonb, {_NOW},
        {_WINDOW_END}, {_WINDOW_END}, {_TAKE}, %(request_path)s
    )
    ON CONFLICT (principal, endpoint, key) DO NOTHING
    RETURNING id, owner_pid
)
SELECT true AS won, id, NULL::uuid AS owner_token, NULL::varchar AS state,
       NULL::varchar AS fingerprint, ''::varchar AS recovery_point,
       NULL::float8 AS lease_remaining, NULL::boolean AS expired,
       NULL::int AS response_status, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body,
       EXTRACT(EPOCH FROM clock_timestamp() - statement_timestamp())::float8 AS waited,
       owner_pid, {_HOLD} AS present, false AS owner_gone, false AS ended_by_operator,
       NULL::float8 AS age_seconds, NULL::float8 AS window_seconds
FROM claimed
UNION ALL
SELECT false, id, owner_token, state, fingerprint, recovery_point,
       EXTRACT(EPOCH FROM lease_until - {_NOW})::float8, expires_at <= {_NOW},
       response_status, response_headers, response_body, NULL::float8,
       owner_pid, false, {owner_gone()}, lease_until = created_at, {_AGE}, {_WINDOW}
FROM {TABLE}
WHERE principal = %(principal)s AND endpoint = %(endpoint)s AND key = %(key)s
  AND NOT EXISTS (SELECT 1 FROM claimed)
"""

#: Read one record with its lease and expiry judged by the database's clock, and, when
#: ``%(test)s``, whether its owner is gone as a claim finds it (:func:`owner_gone`, the
#: claim's own test, which takes the presence lock at transaction level as the claim's
#: does).
PG_FETCH_SQL = f"""
SELECT false AS won, id, owner_token, state, fingerprint, recovery_point,
       EXTRACT(EPOCH FROM lease_until - {_NOW})::float8 AS lease_remaining,
       expires_at <= {_NOW} AS expired,
       response_status, response_headers, response_body, owner_pid,
       {owner_gone()} AS owner_gone,
       lease_until = created_at AS ended_by_operator,
       {_AGE} AS age_seconds, {_WINDOW} AS window_seconds
FROM {TABLE}
WHERE principal = %(principal)s AND endpoint = %(endpoint)s AND key = %(key)s
"""

#: A plain-table claim that queued behind another transaction: its times again, from
#: after the wait (fenced: a contender that took it over in between keeps it).
PG_RESTAMP_SQL = f"""
UPDATE {TABLE} SET created_at = {_NOW}, lease_until = {_NOW} + %(lease)s * interval '1 second',
    expires_at = {_WINDOW_END}, sweep_after = {_WINDOW_END}
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Completion through ``django_idempotency_complete`` (``schema.functions``), fenced by
#: the owner token: planned once per session, and raising when the fence matches no
#: row (the caller turns that into ``LeaseLost``). The response stays replayable for at
#: least ``grace`` seconds (the lease) after it commits, even when the completion comes
#: late in the window (docs/retention.md).
_COMPLETE_CALL = (
    "SELECT django_idempotency_complete(%(id)s, %(token)s, %(status)s, %(headers)s::jsonb, "
    "%(body)s, %(grace)s, %(clock_offset)s, {unlock})"
)


#: The completion for a large body (``records.postgresql.BOUND_BODY_BYTES``): every parameter typed,
#: for a cursor that binds them on the server, the body as a binary parameter.
_COMPLETE_BOUND_CALL = (
    "SELECT django_idempotency_complete(%(id)s::bigint, %(token)s::uuid, "
    "%(status)s::integer, %(headers)s::jsonb, %(body)b, %(grace)s::float8, "
    "%(clock_offset)s::float8, {unlock})"
)


def complete_bound_sql(*, unlock: bool) -> str:
    """The completion through the server-side function, its parameters bound server-side.

    ``unlock``: as in :func:`complete_call_sql`.
    """
    key = presence_key().replace("%(principal)s", "%(principal)s::text")
    return _COMPLETE_BOUND_CALL.format(unlock=key if unlock else "NULL")


def complete_call_sql(*, unlock: bool) -> str:
    """The completion through the server-side function.

    ``unlock``: the presence lock is released in the same statement (the parameters
    then include the scope).
    """
    return _COMPLETE_CALL.format(unlock=_KEY if unlock else "NULL")


#: Release (delete) of a claim we own, with no recovery point, fenced, then the
#: presence lock released in the same statement. The aggregate consumes the DELETE
#: first, so the row is locked before the presence lock goes: a duplicate that finds
#: the lock free from then on queues behind the row lock until this transaction ends.
PG_RELEASE_UNLOCK_SQL = f"""
WITH gone AS (
    DELETE FROM {TABLE}
    WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
      AND recovery_point = ''
    RETURNING 1
)
SELECT n, pg_advisory_unlock({_KEY}) FROM (SELECT count(*) AS n FROM gone) g
"""

#: Release of a presence lock on its own (a path without a statement to join).
PG_UNLOCK_SQL = f"SELECT pg_advisory_unlock({_KEY})"

#: A waiting duplicate queues for the presence lock (shared: every waiter wakes at once).
PG_WAIT_PRESENCE_SQL = f"SELECT pg_advisory_xact_lock_shared({_KEY})"

#: Then for the row lock of the owner's completion, until its transaction ends.
PG_WAIT_ROW_SQL = f"""
SELECT 1 FROM {TABLE}
WHERE principal = %(principal)s AND endpoint = %(endpoint)s AND key = %(key)s FOR SHARE
"""

#: Heartbeat: extend a lease we still own (the window never ends before the lease).
PG_EXTEND_SQL = f"""
UPDATE {TABLE} SET lease_until = {_NOW} + %(seconds)s * interval '1 second',
    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Takeover of a claim whose lease ran out, or (``%(by_presence)s``) whose owner's
#: session was found gone (:func:`owner_gone`: a session does not come back), if nobody
#: changed it since it was read: the same owner token, state and recovery point. The
#: new owner takes the presence lock as a new claim does (``present``); a contender
#: testing it at that moment leaves the new claim without one (``owner_pid`` NULL: its
#: lease alone decides). ``SKIP LOCKED``: a row locked by an owner's open transaction
#: (its completion or phase written, not yet committed) is never waited for; the
#: caller reads the record again.
PG_TAKEOVER_SQL = f"""
WITH stale AS (
    SELECT id FROM {TABLE}
    WHERE id = %(id)s AND state = 'claimed' AND owner_token = %(token)s
      AND recovery_point = %(recovery_point)s
      AND (lease_until <= {_NOW} OR %(by_presence)s)
    FOR UPDATE SKIP LOCKED
)
UPDATE {TABLE} r SET owner_token = %(new_token)s,
    lease_until = {_NOW} + %(lease)s * interval '1 second',
    expires_at = GREATEST(r.expires_at, {_NOW} + %(lease)s * interval '1 second'),
    owner_pid = CASE WHEN %(take)s AND pg_try_advisory_xact_lock({presence_key("r.")})
                THEN pg_backend_pid() END
FROM stale
WHERE r.id = stale.id
RETURNING CASE WHEN r.owner_pid IS NOT NULL
          THEN pg_try_advisory_lock({presence_key("r.")}) ELSE false END AS present
"""

#: Forget a record past its window and its lease (the plain table), never waiting on
#: a row another transaction holds.
PG_FORGET_SQL = f"""
DELETE FROM {TABLE}
WHERE id = (
    SELECT id FROM {TABLE}
    WHERE id = %(id)s AND owner_token = %(token)s AND expires_at <= {_NOW}
      AND (state = 'completed' OR lease_until <= {_NOW})
    FOR UPDATE SKIP LOCKED
)
"""


def pg_now() -> tuple[str, list[float]]:
    """``(sql, params)`` for "now" on PostgreSQL, with one positional parameter."""
    return ("(statement_timestamp() + %s * interval '1 second')", [clock.offset()])


#: The claim on a partitioned table: one statement, one round trip.
PG_PARTITIONED_CLAIM_SQL = """
SELECT won, id, owner_token, state, fingerprint, recovery_point, lease_remaining,
       expired, response_status, response_headers, response_body, owner_pid, present,
       owner_gone, ended_by_operator, age_seconds, window_seconds
FROM django_idempotency_claim(
    %(principal)s::varchar, %(endpoint)s::varchar, %(key)s::varchar,
    %(fingerprint)s::varchar, %(token)s::uuid, %(lease)s::float8,
    %(retention)s::float8, %(clock_offset)s::float8, %(take)s::boolean,
    %(test)s::boolean, %(request_path)s::varchar)
"""


#: The SQLSTATE ``django_idempotency_complete`` raises when fenced off (its own class).
FENCED_SQLSTATE = "DIF01"
