"""Where a claim and a completion spend their buffers: an empty table against a full one.

Not a test: a diagnosis for benchmarks/scale.py (which calls it with ``--explain``), or
standalone on two databases left by ``scale.py --keep``::

    python benchmarks/scale_explain.py EMPTY_URL FULL_URL --count 200

On each database it runs ``--count`` claims of new keys, each under
``EXPLAIN (ANALYZE, BUFFERS)`` and committed, as the app sends them (the
``django_idempotency_claim`` function on the partitioned table, the
``INSERT ... ON CONFLICT`` statement on the plain one), then completes each claim with a
1 KB response under ``EXPLAIN (ANALYZE, BUFFERS)`` (``django_idempotency_complete``,
committed). Per database and statement it prints the median execution time on the
server and the median shared buffers hit and read (read: not in ``shared_buffers``,
from the OS cache or the disk), and the plan of the claim's lookup of the scope in
every partition, which is the statement whose cost can grow with the table. Buffer
counts do not depend on the machine's load; times do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_idempotency.store.sql import (
    PG_CLAIM_SQL,
    PG_PARTITIONED_CLAIM_SQL,
    complete_call_sql,
)

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
#: The completions' response: 1 KB that does not compress, the fill's average size.
RESPONSE_BODY = os.urandom(500).hex().encode()
LOOKUP = (
    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM django_idempotency_record r "
    "WHERE r.principal = %s AND r.endpoint = %s AND r.key = %s"
)


def _totals(plan: list[dict[str, Any]]) -> tuple[float, int, int]:
    top = plan[0]
    node = top["Plan"]
    return (
        float(top["Execution Time"]),
        int(node.get("Shared Hit Blocks", 0)),
        int(node.get("Shared Read Blocks", 0)),
    )


def explain(url: str, count: int) -> dict[str, Any]:
    """Claims and completions of ``count`` new keys on ``url``, each explained and committed."""
    # Client-side binding, as Django sends them (the statements' types are the server's).
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        partitioned = conn.execute(
            "SELECT relkind = 'p' FROM pg_class WHERE oid = 'django_idempotency_record'::regclass"
        ).fetchone()[0]
        claim_sql = PG_PARTITIONED_CLAIM_SQL if partitioned else PG_CLAIM_SQL
        found: dict[str, list[tuple[float, int, int]]] = {"claim": [], "complete": []}
        for _ in range(count):
            key, token = str(uuid.uuid4()), uuid.uuid4()
            params = {
                "principal": "auth.user:1",
                "endpoint": "POST /items",
                "key": key,
                "fingerprint": "a" * 64,
                "token": token,
                "lease": 60.0,
                "retention": 86400.0,
                "clock_offset": 0.0,
                "take": False,
                "test": True,
                "request_path": "/items",
            }
            with conn.transaction():
                (plan,) = conn.execute(EXPLAIN + claim_sql, params).fetchone()
            found["claim"].append(_totals(plan))
            (row_id,) = conn.execute(
                "SELECT id FROM django_idempotency_record "
                "WHERE principal = %s AND endpoint = %s AND key = %s",
                ["auth.user:1", "POST /items", key],
            ).fetchone()
            complete = {
                "id": row_id,
                "token": token,
                "status": 201,
                "headers": json.dumps([["Content-Type", "application/json"]]),
                "body": RESPONSE_BODY,
                "grace": 0.0,
                "clock_offset": 0.0,
            }
            with conn.transaction():
                (plan,) = conn.execute(
                    EXPLAIN + complete_call_sql(unlock=False), complete
                ).fetchone()
            found["complete"].append(_totals(plan))
        lookup = conn.execute(LOOKUP, ["auth.user:1", "POST /items", str(uuid.uuid4())])
        lookup_plan = "\n".join(line for (line,) in lookup)
    return {
        "partitioned": bool(partitioned),
        "statements": {
            name: {
                "ms": statistics.median(t for t, _, _ in rows),
                "hit": statistics.median(h for _, h, _ in rows),
                "read": statistics.median(r for _, _, r in rows),
            }
            for name, rows in found.items()
        },
        "lookup_plan": lookup_plan,
    }


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| table | statement | server ms (median) | shared buffers hit | read |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, result in results.items():
        for statement, s in result["statements"].items():
            lines.append(
                f"| {name} | {statement} | {s['ms']:.3f} | {s['hit']:.0f} | {s['read']:.0f} |"
            )
    for name, result in results.items():
        lines += ["", f"The lookup of a new key in every partition, {name} table:", ""]
        lines += [f"    {line}" for line in result["lookup_plan"].splitlines()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("empty", help="URL of the empty database")
    parser.add_argument("full", help="URL of the full database")
    parser.add_argument("--count", type=int, default=200, help="claims per database")
    args = parser.parse_args(argv)
    results = {
        name: explain(url, args.count) for name, url in (("empty", args.empty), ("full", args.full))
    }
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
