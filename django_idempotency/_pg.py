"""PostgreSQL statements of the store, kept apart so ``store.py`` reads as protocol.

``NOW`` below is the database's clock plus the test offset (``clock.py``); every
statement takes it as ``%(clock_offset)s`` seconds.
"""

from __future__ import annotations

from . import clock

_NOW = "(statement_timestamp() + %(clock_offset)s * interval '1 second')"
_T = "django_idempotency_record"

#: The claim: one statement, one round trip (SPEC §4).
#:
#: The INSERT either creates the row, and the first SELECT returns it (``won``), or
#: hits the unique constraint and does nothing; the second SELECT then returns the row
#: it collided with, so a replay, a 409 or a 422 costs this one statement too. When
#: the colliding row committed after this statement's snapshot was taken, neither
#: SELECT returns a row and the caller reads it with a plain SELECT. No row is locked
#: or written on conflict.
PG_CLAIM_SQL = f"""
WITH claimed AS (
    INSERT INTO {_T} (
        principal, endpoint, key, fingerprint, state, owner_token, lease_until,
        recovery_point, response_headers, created_at, expires_at
    )
    VALUES (
        %(principal)s, %(endpoint)s, %(key)s, %(fingerprint)s, 'claimed', %(token)s,
        {_NOW} + %(lease)s * interval '1 second', '', '[]'::jsonb, {_NOW},
        {_NOW} + %(retention)s * interval '1 second'
    )
    ON CONFLICT (principal, endpoint, key) DO NOTHING
    RETURNING id
)
SELECT true AS won, id, NULL::uuid AS owner_token, NULL::varchar AS state,
       NULL::varchar AS fingerprint, NULL::varchar AS recovery_point,
       NULL::float8 AS lease_remaining, NULL::boolean AS expired,
       NULL::int AS response_status, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body
FROM claimed
UNION ALL
SELECT false, id, owner_token, state, fingerprint, recovery_point,
       EXTRACT(EPOCH FROM lease_until - {_NOW})::float8, expires_at <= {_NOW},
       response_status, response_headers, response_body
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

#: Completion, fenced by the owner token: one precompiled statement (building an ORM
#: UPDATE per request costs several times its CPU; docs/benchmarks.md).
PG_COMPLETE_SQL = f"""
UPDATE {_T} SET state = 'completed', response_status = %(status)s,
    response_headers = %(headers)s::jsonb, response_body = %(body)s,
    completed_at = {_NOW}, lease_until = {_NOW}
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""

#: Heartbeat: extend a lease we still own.
PG_EXTEND_SQL = f"""
UPDATE {_T} SET lease_until = {_NOW} + %(seconds)s * interval '1 second'
WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'
"""


def pg_now() -> tuple[str, list[float]]:
    """``(sql, params)`` for "now" on PostgreSQL, with one positional parameter."""
    return ("(statement_timestamp() + %s * interval '1 second')", [clock.offset()])
