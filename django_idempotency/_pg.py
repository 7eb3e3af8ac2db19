"""PostgreSQL statements of the store, kept apart so ``store.py`` reads as protocol.

``NOW`` below is the database's clock plus the test offset (``clock.py``); every
statement takes it as ``%(clock_offset)s`` seconds.
"""

from __future__ import annotations

from . import clock

_NOW = "(statement_timestamp() + %(clock_offset)s * interval '1 second')"
_T = "django_idempotency_record"
#: The end of a new claim's retention window: never before its lease ends.
_WINDOW_END = f"{_NOW} + GREATEST(%(retention)s, %(lease)s) * interval '1 second'"

#: The claim: one statement, one round trip.
#:
#: The INSERT either creates the row, and the first SELECT returns it (``won``), or
#: hits the unique constraint and does nothing; the second SELECT then returns the row
#: it collided with, so a replay, a 409 or a 422 costs this one statement too. When
#: the colliding row committed after this statement's snapshot was taken, neither
#: SELECT returns a row and the caller reads it with a plain SELECT. No row is locked
#: or written on conflict. ``waited`` is how long the INSERT queued behind an
#: uncommitted row with the same scope (one whose transaction then rolled back): the
#: store stamps such a claim again (``PG_RESTAMP_SQL``), since its times were taken
#: when the statement started.
PG_CLAIM_SQL = f"""
WITH claimed AS (
    INSERT INTO {_T} (
        principal, endpoint, key, fingerprint, state, owner_token, lease_until,
        recovery_point, response_headers, created_at, expires_at, sweep_after
    )
    VALUES (
        %(principal)s, %(endpoint)s, %(key)s, %(fingerprint)s, 'claimed', %(token)s,
        {_NOW} + %(lease)s * interval '1 second', '', '[]'::jsonb, {_NOW},
        {_WINDOW_END}, {_WINDOW_END}
    )
    ON CONFLICT (principal, endpoint, key) DO NOTHING
    RETURNING id
)
SELECT true AS won, id, NULL::uuid AS owner_token, NULL::varchar AS state,
       NULL::varchar AS fingerprint, NULL::varchar AS recovery_point,
       NULL::float8 AS lease_remaining, NULL::boolean AS expired,
       NULL::int AS response_status, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body,
       EXTRACT(EPOCH FROM clock_timestamp() - statement_timestamp())::float8 AS waited
FROM claimed
UNION ALL
SELECT false, id, owner_token, state, fingerprint, recovery_point,
       EXTRACT(EPOCH FROM lease_until - {_NOW})::float8, expires_at <= {_NOW},
       response_status, response_headers, response_body, NULL::float8
FROM {_T}
WHERE principal = %(principal)s AND endpoint = %(endpoint)s AND key = %(key)s
  AND NOT EXISTS (SELECT 1 FROM claimed)
"""

#: Read one record with its lease and expiry judged by the database's clock.
PG_FETCH_SQL = f"""
SELECT false AS won, id, owner_token, state, fingerprint, recovery_point,
       EXTRACT(EPOCH FROM lease_until - {_NOW})::float8 AS lease_remaining,
       expires_at <= {_NOW} AS expired,
       response_status, response_headers, response_body
FROM {_T}
WHERE principal = %(principal)s AND endpoint = %(endpoint)s AND key = %(key)s
"""

#: A plain-table claim that queued behind another transaction: its times again, from
#: after the wait (fenced: a contender that took it over in between keeps it).
PG_RESTAMP_SQL = f"""
UPDATE {_T} SET created_at = {_NOW}, lease_until = {_NOW} + %(lease)s * interval '1 second',
    expires_at = {_WINDOW_END}, sweep_after = {_WINDOW_END}
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Completion, fenced by the owner token: one precompiled statement (building an ORM
#: UPDATE per request costs several times its CPU; docs/benchmarks.md). The response
#: stays replayable for at least ``grace`` seconds (the lease) after it commits, even
#: when the completion comes late in the window (docs/retention.md).
PG_COMPLETE_SQL = f"""
UPDATE {_T} SET state = 'completed', response_status = %(status)s,
    response_headers = %(headers)s::jsonb, response_body = %(body)s,
    completed_at = {_NOW}, lease_until = {_NOW},
    expires_at = GREATEST(expires_at, {_NOW} + %(grace)s * interval '1 second')
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Heartbeat: extend a lease we still own (the window never ends before the lease).
PG_EXTEND_SQL = f"""
UPDATE {_T} SET lease_until = {_NOW} + %(seconds)s * interval '1 second',
    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Takeover of a claim whose lease ran out, if nobody changed it since it was read.
#: ``SKIP LOCKED``: a row locked by a stalled owner's open transaction (its completion
#: or phase written, not yet committed) is never waited for; the caller answers 409.
PG_TAKEOVER_SQL = f"""
UPDATE {_T} SET owner_token = %(new_token)s,
    lease_until = {_NOW} + %(lease)s * interval '1 second',
    expires_at = GREATEST(expires_at, {_NOW} + %(lease)s * interval '1 second')
WHERE id = (
    SELECT id FROM {_T}
    WHERE id = %(id)s AND state = 'claimed' AND owner_token = %(token)s
      AND recovery_point = %(recovery_point)s AND lease_until <= {_NOW}
    FOR UPDATE SKIP LOCKED
)
"""

#: Forget a record past its window and its lease (the plain table), never waiting on
#: a row another transaction holds.
PG_FORGET_SQL = f"""
DELETE FROM {_T}
WHERE id = (
    SELECT id FROM {_T}
    WHERE id = %(id)s AND owner_token = %(token)s AND expires_at <= {_NOW}
      AND (state = 'completed' OR lease_until <= {_NOW})
    FOR UPDATE SKIP LOCKED
)
"""


def pg_now() -> tuple[str, list[float]]:
    """``(sql, params)`` for "now" on PostgreSQL, with one positional parameter."""
    return ("(statement_timestamp() + %s * interval '1 second')", [clock.offset()])
