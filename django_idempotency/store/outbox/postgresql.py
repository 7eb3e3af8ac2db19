"""The outbox on PostgreSQL: one statement per step (docs/outbox.md).

The claim locks the oldest due ``pending`` messages with ``SELECT ... FOR UPDATE SKIP
LOCKED``, counts an attempt for each and moves its ``available_at`` to the end of the
lease, in one short statement that commits at once: concurrent relays skip the locked
rows and then see them as not due. The same statement dead-letters the abandoned
messages it meets. Marks and renewals are one fenced ``UPDATE`` each for a whole group,
the fence of each message passed as arrays.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.db.models.signals import post_init, pre_init

from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.outbox.base import (
    ABANDONED,
    Buried,
    Claimed,
    Delivered,
    OutboxStore,
)
from django_idempotency.store.sql import pg_now

#: Now by the store's clock, in the statements below (``%(offset)s``: the test offset).
_NOW = "(statement_timestamp() + %(offset)s * interval '1 second')"

_INSERT_SQL = """
INSERT INTO django_idempotency_outbox (
    topic, payload, dedup_key, state, attempts, available_at, last_error, created_at,
    record_id
)
VALUES (%s, %s, %s, %s, 0, COALESCE(%s, {now}), '', {now}, %s)
ON CONFLICT (topic, dedup_key) DO NOTHING
RETURNING id, available_at, created_at
"""

_CLAIM_SQL = """
WITH due AS (
    SELECT id, available_at FROM django_idempotency_outbox
    WHERE state = 'pending' AND available_at <= {now}
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE django_idempotency_outbox AS m
    SET attempts = CASE WHEN m.attempts >= %(max)s THEN m.attempts ELSE m.attempts + 1 END,
        available_at = CASE WHEN m.attempts >= %(max)s THEN {now}
                            ELSE {now} + %(lease)s * interval '1 second' END,
        -- abandoned: the last allowed attempt never reported back
        state = CASE WHEN m.attempts >= %(max)s THEN 'dead' ELSE m.state END,
        last_error = CASE WHEN m.attempts >= %(max)s
                          THEN 'attempt ' || m.attempts || %(abandoned)s
                          ELSE m.last_error END
    WHERE m.id = ANY(ARRAY(SELECT id FROM due))  -- by primary key, whatever the table's size
    RETURNING m.id, m.topic, m.payload, m.dedup_key, m.attempts,
              m.available_at AT TIME ZONE 'UTC' AS until,
              m.created_at AT TIME ZONE 'UTC' AS created, m.record_id,
              EXTRACT(EPOCH FROM {now} - m.created_at)::float8 AS age, m.state
)
SELECT claimed.id, topic, payload, dedup_key, attempts, until, created, record_id, age, state
FROM claimed JOIN due ON due.id = claimed.id
ORDER BY due.available_at, claimed.id
"""

_MARK_SQL = """
UPDATE django_idempotency_outbox AS m
SET state = 'sent', sent_at = {now}
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(until)s::timestamptz[])
     AS c(id, attempts, until)
WHERE m.id = c.id AND m.attempts = c.attempts AND m.available_at >= c.until
  AND m.state = 'pending'
  AND m.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the table's size
RETURNING m.id
"""

_RENEW_SQL = """
UPDATE django_idempotency_outbox AS m
SET available_at = {now} + %(lease)s * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(until)s::timestamptz[])
     AS c(id, attempts, until)
WHERE m.id = c.id AND m.attempts = c.attempts AND m.available_at >= c.until
  AND m.state = 'pending'
  AND m.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the table's size
RETURNING m.id, m.available_at AT TIME ZONE 'UTC'
"""


class PostgresOutbox(OutboxStore):
    """The outbox's statements on PostgreSQL; see :class:`OutboxStore` for each method."""

    concurrent_writers = True

    def now(self, plus_seconds: float = 0.0) -> Any:
        """``statement_timestamp()`` plus the test offset, as SQL."""
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])

    def insert(self, fields: dict[str, Any], available_at: dt.datetime | None) -> OutboxMessage:
        """One ``INSERT ... ON CONFLICT DO NOTHING``; on conflict, a read."""
        connection = self.connection
        now_sql, now_params = pg_now()
        payload = OutboxMessage._meta.get_field("payload").get_db_prep_save(
            fields["payload"], connection
        )
        params = [fields["topic"], payload, fields["dedup_key"], OutboxState.PENDING]
        params += [available_at, *now_params, *now_params, fields["record_id"]]
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_SQL.format(now=now_sql), params)
            row = cursor.fetchone()
        if row is None:
            return OutboxMessage.objects.using(self.using).get(
                topic=fields["topic"], dedup_key=fields["dedup_key"]
            )
        message = OutboxMessage(id=row[0], available_at=row[1], created_at=row[2], **fields)
        message._state.adding = False
        message._state.db = self.using
        return message

    def claim_due(
        self, limit: int, lease: float, max_attempts: int
    ) -> tuple[list[Claimed], list[Buried]]:
        """One statement: lock with ``SKIP LOCKED``, claim or dead-letter, return."""
        params: dict[str, Any] = {
            "offset": clock.offset(),
            "limit": limit,
            "lease": lease,
            "max": max_attempts,
            "abandoned": ABANDONED.removeprefix("attempt {attempts}"),
        }
        with self.connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL.format(now=_NOW), params)
            rows = cursor.fetchall()
        buried = [Buried(row[0], row[1], row[4]) for row in rows if row[9] != OutboxState.PENDING]
        if buried:
            rows = [row for row in rows if row[9] == OutboxState.PENDING]
        return _messages(rows, self.using), buried

    def write_sent(self, sent: Sequence[Delivered]) -> set[int]:
        """One fenced ``UPDATE`` for the whole group."""
        if not sent:
            return set()
        with self.connection.cursor() as cursor:
            cursor.execute(_MARK_SQL.format(now=_NOW), _fences(sent))
            return {row[0] for row in cursor.fetchall()}

    def renew(self, held: Sequence[Delivered], lease: float) -> dict[int, dt.datetime]:
        """One fenced ``UPDATE`` for every message held."""
        if not held:
            return {}
        with self.connection.cursor() as cursor:
            cursor.execute(_RENEW_SQL.format(now=_NOW), {**_fences(held), "lease": lease})
            return {row[0]: clock.utc_from_naive(row[1]) for row in cursor.fetchall()}


def _fences(items: Sequence[Delivered]) -> dict[str, Any]:
    """The ids of ``items`` with their claims' fences, as the statements' arrays.

    Lease ends go as ISO strings with their offset: the exact instant whatever the
    session's time zone (``USE_TZ = False`` sets it to ``TIME_ZONE``); one string per
    claim.
    """
    iso: dict[dt.datetime, str] = {}
    until = []
    for item in items:
        end = item.message.available_at
        text = iso.get(end)
        if text is None:
            text = iso[end] = end.astimezone(dt.UTC).isoformat()
        until.append(text)
    return {
        "offset": clock.offset(),
        "ids": [item.message.pk for item in items],
        "attempts": [item.message.attempts for item in items],
        "until": until,
    }


def _messages(rows: list[tuple[Any, ...]], using: str) -> list[Claimed]:
    """``OutboxMessage`` objects from the claim's rows, as ``Model.from_db`` builds them.

    Built without ``Model.__init__`` (a fifth of the relay's time per message at
    batch 1000) when nobody listens to ``pre_init`` or ``post_init`` for the model:
    the same attributes, set directly. The lease end is the same for the whole batch.
    """
    if pre_init.has_listeners(OutboxMessage) or post_init.has_listeners(OutboxMessage):
        built = []
        for row in rows:
            message = OutboxMessage(
                id=row[0], topic=row[1], payload=_payload(row[2]), dedup_key=row[3],
                attempts=row[4], available_at=clock.utc_from_naive(row[5]),
                created_at=clock.utc_from_naive(row[6]), record_id=row[7],
            )  # fmt: skip
            message._state.adding = False
            message._state.db = using
            built.append(Claimed(message, row[8]))
        return built
    new = object.__new__
    loads = json.loads
    until: dict[Any, dt.datetime] = {}
    claimed = []
    for row in rows:
        state = ModelState()
        state.adding = False
        state.db = using
        message = new(OutboxMessage)
        payload = row[2]
        lease_end = until.get(row[5])
        if lease_end is None:
            # Read as UTC in SQL: exact for the fence whatever the session's time zone
            # (USE_TZ = False sets it to TIME_ZONE).
            lease_end = until[row[5]] = clock.utc_from_naive(row[5])
        message.__dict__.update(
            _state=state,
            id=row[0],
            topic=row[1],
            payload=loads(payload) if isinstance(payload, str) else payload,
            dedup_key=row[3],
            state=OutboxState.PENDING,
            attempts=row[4],
            available_at=lease_end,
            last_error="",
            created_at=clock.utc_from_naive(row[6]),
            sent_at=None,
            record_id=row[7],
        )
        claimed.append(Claimed(message, row[8]))
    return claimed


def _payload(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
