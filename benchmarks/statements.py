"""The protocol's statements one by one: latency, PostgreSQL CPU and Python CPU each.

Not a test: the measurement behind "Where the time goes" in docs/benchmarks.md. On a
throwaway PostgreSQL database (loopback only), one connection, it times ``--requests``
executions of:

* the claim as django-idempotency sends it (``django_idempotency_claim(...)`` on the
  day-partitioned table), the plain-table ``INSERT ... ON CONFLICT`` claim for
  comparison, and both with ``synchronous_commit = off``;
* the completion as ``store.complete`` sends it (an ORM ``UPDATE``) and the same
  ``UPDATE`` as one precompiled SQL string, each in its own ``atomic()`` block;
* a one-row ``INSERT`` in ``atomic()`` and ``atomic()`` around ``SELECT 1``, as
  references.

PostgreSQL CPU is read from ``/proc/<backend pid>/stat`` (Linux, server on this
machine); Python CPU is this process's. Usage::

    python benchmarks/statements.py --requests 1000
    python benchmarks/statements.py --partitions 40     # 40 more day partitions first
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "example_project"))
sys.path.insert(0, str(ROOT))

from storm.server import ThrowawayDatabase  # noqa: E402

COMPLETE_SQL = (
    "UPDATE django_idempotency_record SET state = 'completed', response_status = %s, "
    "response_headers = %s::jsonb, response_body = %s, completed_at = statement_timestamp(), "
    "lease_until = statement_timestamp() "
    "WHERE id = %s AND owner_token = %s AND state = 'claimed'"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=0, help="extra past day partitions")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    db = ThrowawayDatabase(args.database_url)
    db.create()
    try:
        os.environ.update(
            DJANGO_SETTINGS_MODULE="leasebroker.settings", DATABASE_URL=db.url, DEBUG="false"
        )
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        call_command("create_demo_principals", stdout=open(os.devnull, "w"))  # noqa: SIM115
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        db.drop()
    return 0


def run(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    from django_idempotency import store
    from django_idempotency.store import Scope, StoredResponse, sql
    from django_idempotency.store.sql import PG_PARTITIONED_CLAIM_SQL

    cursor = connection.cursor()
    cursor.execute("SELECT pg_backend_pid()")
    backend = cursor.fetchone()[0]
    today = dt.date.today()
    for days in range(1, args.partitions + 1):
        cursor.execute(
            "SELECT django_idempotency_ensure_partition(%s)", [today - dt.timedelta(days=days)]
        )
    cursor.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'django_idempotency_record'::regclass"
    )
    partitions = cursor.fetchone()[0]
    cursor.execute("CREATE TABLE plain_record (LIKE django_idempotency_record INCLUDING DEFAULTS)")
    cursor.execute(
        "CREATE SEQUENCE plain_seq; ALTER TABLE plain_record ALTER id SET DEFAULT "
        "nextval('plain_seq'); ALTER TABLE plain_record ADD PRIMARY KEY (id); "
        "ALTER TABLE plain_record ADD UNIQUE (principal, endpoint, key)"
    )
    plain_claim = sql.PG_CLAIM_SQL.replace("django_idempotency_record", "plain_record")
    tick = os.sysconf("SC_CLK_TCK")

    def backend_cpu() -> float:
        fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    def params() -> dict[str, Any]:
        return {
            "principal": "bench",
            "endpoint": "POST /v1/workers",
            "key": str(uuid.uuid4()),
            "fingerprint": "f" * 64,
            "token": uuid.uuid4(),
            "lease": 60.0,
            "retention": 86400.0,
            "clock_offset": 0.0,
        }

    def measure(label: str, step: Callable[[], object]) -> None:
        for _ in range(50):
            step()
        times = []
        cpu_db, cpu_py = backend_cpu(), time.process_time()
        for _ in range(args.requests):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        cpu_db, cpu_py = backend_cpu() - cpu_db, time.process_time() - cpu_py
        n = args.requests / 1000
        print(
            f"| {label} | {statistics.median(times) * 1000:.3f} | {cpu_db / n:.3f} | "
            f"{cpu_py / n:.3f} |"
        )

    print(f"PostgreSQL, {partitions} day partitions, {args.requests} executions each\n")
    print("| statement | median ms | PostgreSQL CPU ms | Python CPU ms |")
    print("| --- | ---: | ---: | ---: |")
    measure(
        "claim (partitioned table, as shipped)",
        lambda: cursor.execute(PG_PARTITIONED_CLAIM_SQL, params()),
    )
    measure(
        "claim (plain table, INSERT ON CONFLICT)", lambda: cursor.execute(plain_claim, params())
    )
    cursor.execute("SET synchronous_commit = off")
    measure(
        "claim (partitioned), synchronous_commit off",
        lambda: cursor.execute(PG_PARTITIONED_CLAIM_SQL, params()),
    )
    cursor.execute("SET synchronous_commit = on")

    response = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": "w"}' * 40)
    claims = iter(
        [
            store.claim(
                Scope("bench", "POST /c", str(uuid.uuid4())), "f" * 64, lease=60, retention=86400
            )
            for _ in range(3 * (args.requests + 50))
        ]
    )

    def orm_complete() -> None:
        with transaction.atomic():
            store.complete(next(claims), response)  # type: ignore[arg-type]

    def raw_complete() -> None:
        claim = next(claims)
        with transaction.atomic():
            cursor.execute(
                COMPLETE_SQL,
                [
                    response.status,
                    json.dumps(response.headers),
                    response.body,
                    claim.record_id,
                    claim.owner_token,
                ],  # type: ignore[union-attr]
            )

    def pruned_complete() -> None:
        claim = next(claims)
        cursor.execute(
            "SELECT sweep_after FROM django_idempotency_record WHERE id = %s",
            [claim.record_id],  # type: ignore[union-attr]
        )
        created = cursor.fetchone()[0]  # the claim would carry it; not timed below
        started = time.perf_counter()
        with transaction.atomic():
            cursor.execute(
                COMPLETE_SQL + " AND sweep_after = %s",
                [
                    response.status,
                    json.dumps(response.headers),
                    response.body,
                    claim.record_id,
                    claim.owner_token,
                    created,
                ],  # type: ignore[union-attr]
            )
        pruned_times.append(time.perf_counter() - started)

    pruned_times: list[float] = []

    def reference_insert() -> None:
        with transaction.atomic():
            cursor.execute(
                "INSERT INTO workers_worker (id, owner_id, image, cpu, memory_gb, labels, state,"
                " reboots, vm_id, created_at) SELECT substr(md5(random()::text), 1, 9), id, 'b',"
                " 1, 1, '{}'::jsonb, 'running', 0, '', now() FROM auth_user LIMIT 1"
            )

    def empty_block() -> None:
        with transaction.atomic():
            cursor.execute("SELECT 1")

    measure("completion: store.complete (ORM UPDATE) in atomic()", orm_complete)
    measure("completion: one precompiled SQL UPDATE in atomic()", raw_complete)
    measure("completion: SQL UPDATE + sweep_after (pruned to one partition)*", pruned_complete)
    measure("reference: one worker INSERT in atomic()", reference_insert)
    measure("reference: atomic() around SELECT 1", empty_block)
    cursor.close()
    if pruned_times:
        print(
            "\n* its CPU columns include a SELECT of sweep_after per execution, which the "
            "claim would return; the UPDATE alone: median "
            f"{statistics.median(pruned_times[-args.requests :]) * 1000:.3f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
