"""What the keys-minted audit costs on a large record table (docs/contributing/benchmarks.md).

Not a test: a measurement. It migrates a throwaway PostgreSQL database (the app's own
migration: the day-partitioned table), fills it with ``--records`` completed records
created evenly over the last ``--days`` days (``benchmarks/scale_fill.py``), adds
``--groups`` groups of one principal and one request under three keys, vacuums, then
runs the audit's statement (``management.audit``) under ``EXPLAIN (ANALYZE, BUFFERS)``
for each ``--windows`` (hours), ``--repeat`` times. It prints per window the records in
it, the groups found, the median execution time on the server and the shared buffers
hit and read, and the scans of the plan (which index serves it). Usage::

    python benchmarks/audit.py --records 1000000
    python benchmarks/audit.py --records 10000000 --windows 1,6,24 --json /tmp/audit.json

Needs psycopg and Django (the example extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import django  # noqa: E402
from minimal_view import django_admin, server_env  # noqa: E402
from scale_fill import connect, fill, settle, sizes  # noqa: E402

from storm.server import SetupError, ThrowawayDatabase  # noqa: E402

# The audit's statement is the app's own: read it with the benchmark app's settings.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "minimal_app.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
django.setup()

from django_idempotency.management.audit import _SQL  # noqa: E402

TABLE = "django_idempotency_record"

#: ``--groups`` groups: each copies one record twice under new keys, a minute apart.
GROUPS = f"""
INSERT INTO {TABLE} (
    principal, endpoint, key, fingerprint, state, owner_token, lease_until,
    recovery_point, response_status, response_headers, response_body, created_at,
    completed_at, expires_at, sweep_after)
SELECT principal, endpoint, gen_random_uuid()::text, fingerprint, state, gen_random_uuid(),
       lease_until + c * interval '1 minute', recovery_point, response_status,
       response_headers, response_body, created_at + c * interval '1 minute',
       completed_at + c * interval '1 minute', expires_at + c * interval '1 minute',
       sweep_after + c * interval '1 minute'
FROM (SELECT * FROM {TABLE} WHERE created_at < statement_timestamp() - interval '3 minutes'
      ORDER BY hashint8(id) LIMIT %(groups)s) AS r,
     generate_series(1, 2) AS c
"""


#: The index the audit could use instead: its columns in the leaf, for index-only scans.
COVERING = (
    f"CREATE INDEX audit_covering ON {TABLE} (created_at) "
    "INCLUDE (endpoint, principal, fingerprint, state)"
)
#: Bytes of the created_at index and of the covering one, over every partition.
INDEX_SIZE = """
SELECT array_agg(pg_size_pretty(s) ORDER BY n) FROM (
    SELECT CASE WHEN i.indnatts > i.indnkeyatts THEN 2 ELSE 1 END AS n,
           sum(pg_relation_size(i.indexrelid)) AS s
    FROM pg_index i
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
    JOIN pg_class t ON t.oid = i.indrelid
    WHERE a.attname = 'created_at' AND t.relname LIKE 'django_idempotency_record%%'
    GROUP BY 1) AS x
"""


def scans(plan: dict[str, Any]) -> list[str]:
    """The scan nodes of a JSON plan: ``"Index Scan on <index>"`` and the like."""
    found = []
    node_type = plan.get("Node Type", "")
    if "Scan" in node_type:
        found.append(f"{node_type} {plan.get('Index Name') or plan.get('Relation Name', '')}")
    for child in plan.get("Plans", ()):
        found.extend(scans(child))
    return found


def measure(url: str, windows: list[float], repeat: int) -> list[dict[str, Any]]:
    """The audit's statement for each window: time, buffers, groups and scans."""
    rows = []
    sql = _SQL.format(table=TABLE)
    with connect(url) as conn:
        for hours in windows:
            since = conn.execute(
                "SELECT statement_timestamp() - %s * interval '1 hour'", [hours]
            ).fetchone()[0]
            (in_window,) = conn.execute(
                f"SELECT count(*) FROM {TABLE} WHERE created_at >= %s", [since]
            ).fetchone()
            runs = []
            for _ in range(repeat):
                (plan,) = conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, ["completed", since, 50]
                ).fetchone()
                runs.append(plan[0])
            groups = conn.execute(sql, ["completed", since, 50]).fetchall()
            top = runs[-1]["Plan"]
            kinds = sorted(set(" ".join(s.split()[:-1]) for s in scans(top)))
            indexes = sorted({s.split()[-1] for s in scans(top) if "Index" in s})
            rows.append(
                {
                    "window_hours": hours,
                    "records_in_window": int(in_window),
                    "groups": sum(int(r[3]) for r in groups if r[1] is None),
                    "ms": statistics.median(r["Execution Time"] for r in runs),
                    "ms_runs": [r["Execution Time"] for r in runs],
                    "hit": statistics.median(r["Plan"]["Shared Hit Blocks"] for r in runs),
                    "read": statistics.median(r["Plan"]["Shared Read Blocks"] for r in runs),
                    "scans": kinds,
                    "indexes": indexes[:3] + (["..."] if len(indexes) > 3 else []),
                }
            )
            row = rows[-1]
            times = ", ".join(f"{m:.0f}" for m in row["ms_runs"])
            print(
                f"  window {hours:g} h: {row['records_in_window']} records, {row['groups']} "
                f"groups, {row['ms']:.0f} ms (runs {times}), "
                f"buffers hit {row['hit']:.0f} read {row['read']:.0f}; {', '.join(kinds)} "
                f"({', '.join(row['indexes'])})"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=1.0, help="records created over these days")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--windows", default="1,6,24", help="hours, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--covering",
        action="store_true",
        help="then add an index on created_at covering the grouped columns and measure again",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    windows = [float(w) for w in args.windows.split(",")]
    print(
        f"audit: {args.records} records over {args.days:g} day(s), {args.groups} groups, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    db = ThrowawayDatabase(args.database_url)
    try:
        db.create()
        try:
            django_admin(server_env(db.url), "migrate", "--noinput", "-v", "0")
            seconds = fill(
                db.url,
                args.records,
                window=args.days * 86400,
                principals=5000,
                endpoints=40,
                chunk=50_000,
            )
            with connect(db.url) as conn:
                conn.execute("SET session_replication_role = replica")
                conn.execute(GROUPS, {"groups": args.groups})
            started = time.perf_counter()
            settle(db.url)
            print(
                f"  filled in {seconds:.0f} s, settled in {time.perf_counter() - started:.0f} s; "
                f"{sizes(db.url)}"
            )
            rows = measure(db.url, windows, args.repeat)
            if args.covering:
                print(f"  with {COVERING}:")
                with connect(db.url) as conn:
                    conn.execute(COVERING)
                settle(db.url)
                with connect(db.url) as conn:
                    (size,) = conn.execute(INDEX_SIZE).fetchone()
                print(f"  index sizes (created_at, covering): {size}")
                rows += [{**row, "covering": True} for row in measure(db.url, windows, args.repeat)]
        finally:
            db.drop()
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (other work skews the numbers)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
