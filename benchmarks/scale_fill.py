"""Filling a record table with realistic completed records, on the server, fast.

Shared by benchmarks/scale.py and benchmarks/sweep_under_load.py: :func:`fill` inserts
N completed records with ``INSERT ... SELECT generate_series`` (UUID keys, a few
thousand principals, a few dozen endpoints, incompressible bodies of 300 B to 2 KB),
:func:`settle` vacuums and checkpoints, :func:`sizes` measures the table and its
indexes.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "example_project"))

from storm.server import SetupError

TABLE = "django_idempotency_record"

#: 1024 incompressible 2 KB strings the bodies are cut from (so TOAST cannot shrink them).
POOL = """
CREATE TABLE IF NOT EXISTS scale_body_pool AS
SELECT i, (SELECT string_agg(md5(i::text || '-' || g), '') FROM generate_series(1, 64) g) AS s
FROM generate_series(0, 1023) i
"""

#: Records first..last of total, created evenly over the window before ``now``, completed.
FILL = f"""
INSERT INTO {TABLE} (
    principal, endpoint, key, fingerprint, state, owner_token, lease_until,
    recovery_point, response_status, response_headers, response_body, created_at,
    completed_at, expires_at, sweep_after)
SELECT 'auth.user:' || (1 + (hashint8(n) & 2147483647) %% %(principals)s),
       CASE WHEN n %% %(endpoints)s = 0 THEN 'POST /items'
            ELSE 'POST /v1/resource-' || n %% %(endpoints)s || '/items' END,
       gen_random_uuid()::text, md5(n::text) || md5((-n)::text), 'completed',
       gen_random_uuid(), t + interval '50 milliseconds', '', 201,
       '[["Content-Type", "application/json"], ["Location", "/items/1"]]'::jsonb,
       convert_to('{{"id": ' || n || ', "note": "'
                  || substr(p.s, 1, 270 + (hashint8(-n) & 2147483647) %% 1731) || '"}}', 'UTF8'),
       t, t + interval '50 milliseconds', t + %(window)s * interval '1 second',
       t + %(window)s * interval '1 second'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
JOIN scale_body_pool p ON p.i = n %% 1024,
     LATERAL (SELECT %(now)s::timestamptz
                     - %(window)s * interval '1 second' * (1 - n::float8 / %(total)s)) AS s(t)
"""


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def fill(
    url: str,
    total: int,
    *,
    window: float,
    principals: int,
    endpoints: int,
    chunk: int,
    now: Any = None,
) -> float:
    """Insert ``total`` completed records on the server; the seconds it took.

    The records are created over the ``window`` seconds before ``now`` (by default the
    database's clock) and each one's window is ``window`` seconds: an older ``now`` makes
    expired records (the sweep benchmark's). The scope trigger is skipped
    (``session_replication_role = replica``): the UUID keys are unique by construction.
    Day partitions the rows need are created first.
    """
    started = time.perf_counter()
    with connect(url) as conn:
        conn.execute(POOL)
        if now is None:
            now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
        partitioned = conn.execute(
            "SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", [TABLE]
        ).fetchone()[0]
        if partitioned:
            # Before the fill, nothing runs beside it: CREATE ... PARTITION OF is enough.
            days = conn.execute(
                "SELECT d::date FROM generate_series("
                "(%(now)s::timestamptz AT TIME ZONE 'UTC')::date, "
                "((%(now)s::timestamptz + %(window)s * interval '1 second') AT TIME ZONE 'UTC')"
                "::date, interval '1 day') d",
                {"now": now, "window": window},
            ).fetchall()
            for (day,) in days:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {TABLE}_p{day:%Y%m%d} PARTITION OF {TABLE} "
                    "FOR VALUES FROM (%s) TO (%s) WITH (fillfactor = 75)",
                    [
                        day.isoformat() + " 00:00+00",
                        (day + dt.timedelta(days=1)).isoformat() + " 00:00+00",
                    ],
                )
    chunks = [(first, min(first + chunk - 1, total)) for first in range(1, total + 1, chunk)]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        with connect(url) as conn:
            conn.execute("SET session_replication_role = replica")
            conn.execute("SET synchronous_commit = off")
            while True:
                with lock:
                    if not chunks or failures:
                        return
                    first, last = chunks.pop(0)
                params = {"first": first, "last": last, "total": total, "now": now}
                params.update(window=window, principals=principals, endpoints=endpoints)
                try:
                    conn.execute(FILL, params)
                except BaseException as exc:
                    failures.append(exc)
                    return

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SetupError(f"the fill failed: {failures[0]}")
    return time.perf_counter() - started


def token_of(url: str) -> str:
    """The benchmark user's token in a database ``prepare`` set up."""
    with connect(url) as conn:
        return str(conn.execute("SELECT key FROM authtoken_token").fetchone()[0])


def settle(url: str) -> None:
    """``VACUUM (ANALYZE)`` the tables and checkpoint: no background work left to time."""
    with connect(url) as conn:
        conn.execute(f"VACUUM (ANALYZE) {TABLE}")
        conn.execute("VACUUM (ANALYZE) django_idempotency_outbox")
        conn.execute("CHECKPOINT")


def sizes(url: str) -> dict[str, int]:
    """Rows, table bytes (heap, TOAST, maps) and index bytes of the record table."""
    with connect(url) as conn:
        table, indexes = conn.execute(
            "SELECT COALESCE(sum(pg_table_size(relid)), 0), "
            "COALESCE(sum(pg_indexes_size(relid)), 0) "
            "FROM (SELECT relid FROM pg_partition_tree(%s::regclass) "
            "UNION SELECT %s::regclass) AS t",
            [TABLE, TABLE],
        ).fetchone()
        (rows,) = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
    return {"rows": int(rows), "table_bytes": int(table), "index_bytes": int(indexes)}
