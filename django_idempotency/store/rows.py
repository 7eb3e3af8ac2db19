"""Reading a record, and what every statement of the store shares.

:func:`fetch` reads the record of a scope with one SELECT and turns the row into an
:class:`~django_idempotency.store.values.Existing`; the helpers below build the scope's
filter and parameters, the store's clock as an ORM value (``now_value``), and read a
database error's SQLSTATE.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import (
    connections,
)
from django.db.models.expressions import RawSQL

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock
from django_idempotency.store.routing import record_database
from django_idempotency.store.sql import (
    PG_FETCH_SQL,
    pg_now,
)
from django_idempotency.store.values import (
    Existing,
    Headers,
    Scope,
    StoredResponse,
    decode_body,
)


def now_value(using: str, plus_seconds: float = 0.0) -> Any:
    """Now (+ ``plus_seconds``) as the store's clock gives it, for ORM queries."""
    if connections[using].vendor == "postgresql":
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])
    return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), connections[using])


def _headers_from_db(value: Any) -> Headers:
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return [(str(name), str(val)) for name, val in value or ()]


def existing_from_row(row: dict[str, Any]) -> Existing:
    """The :class:`Existing` record a row of the claim or fetch statement describes."""
    response = None
    if row["state"] == RecordState.COMPLETED:
        raw = row["response_body"]
        response = StoredResponse(
            status=int(row["response_status"]),
            headers=_headers_from_db(row["response_headers"]),
            body=b"" if raw is None else decode_body(raw),
            replayable=raw is not None,
        )
    return Existing(
        record_id=row["id"],
        state=row["state"],
        fingerprint=row["fingerprint"],
        lease_remaining=float(row["lease_remaining"]),
        expired=bool(row["expired"]),
        response=response,
        owner_token=row["owner_token"],
        recovery_point=row["recovery_point"] or "",
        owner_pid=row.get("owner_pid"),
        owner_gone=bool(row.get("owner_gone")),
        ended_by_operator=bool(row.get("ended_by_operator")),
        age=_seconds(row.get("age_seconds")),
        window=_seconds(row.get("window_seconds")),
    )


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def scope_filter(scope: Scope) -> dict[str, str]:
    """``scope`` as ORM filter arguments (and SQL parameters): principal, endpoint, key."""
    return {"principal": scope.principal, "endpoint": scope.endpoint, "key": scope.key}


def pg_params(scope: Scope, **extra: Any) -> dict[str, Any]:
    """The parameters of a PostgreSQL statement on ``scope``: its filter, the clock's offset."""
    return {**scope_filter(scope), "clock_offset": clock.offset(), **extra}


def fetch(
    scope: Scope, *, using: str | None = None, test_presence: bool = False
) -> Existing | None:
    """Read the record for ``scope`` with one SELECT; ``None`` if there is none.

    ``test_presence``: on PostgreSQL, also test whether its owner is gone, as a claim
    does (``Existing.owner_gone``; pass ``presence.tests(connection)``). Elsewhere, and
    without it, ``owner_gone`` is ``False``.
    """
    using = using or record_database()
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(PG_FETCH_SQL, pg_params(scope, test=test_presence))
            row = cursor.fetchone()
            if row is None:
                return None
            columns = [col.name for col in cursor.description]
        return existing_from_row(dict(zip(columns, row, strict=True)))
    found = (
        IdempotencyRecord.objects.using(using)
        .filter(**scope_filter(scope))
        .values(
            "id",
            "owner_token",
            "state",
            "fingerprint",
            "recovery_point",
            "lease_until",
            "expires_at",
            "response_status",
            "response_headers",
            "response_body",
            "created_at",
        )
        .first()
    )
    if found is None:
        return None
    values: dict[str, Any] = dict(found)
    now = clock.app_now()
    lease_until = clock.from_db(values["lease_until"], connection)
    values["ended_by_operator"] = values["lease_until"] == values["created_at"]
    values["lease_remaining"] = (lease_until - now).total_seconds()
    expires_at = clock.from_db(values["expires_at"], connection)
    values["expired"] = expires_at <= now
    created_at = clock.from_db(values["created_at"], connection)
    values["age_seconds"] = (now - created_at).total_seconds()
    values["window_seconds"] = (expires_at - created_at).total_seconds()
    return existing_from_row(values)


def sqlstate_of(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a Django database error (that of the driver's error it wraps)."""
    return getattr(getattr(exc, "__cause__", None), "sqlstate", None)
