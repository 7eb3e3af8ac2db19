"""The protocol's two statements one by one, against references, on the partitioned table.

Not a test: a measurement (docs/contributing/performance.md). On a throwaway PostgreSQL
database (loopback only), one connection, it runs ``--requests`` executions of each
statement below, the two sides of each comparison interleaved in blocks of 50 (A B B A
...), so drift and neighbours hit both alike:

* the claim as django-idempotency sends it on the day-partitioned table, against
  ``atomic()`` around ``SELECT 1`` (a reference: what any statement in its own
  transaction costs);
* the completion as ``store.complete`` sends it in its ``atomic()`` block, against the
  same reference (with ``--partitions``, how its cost grows with the day partitions it
  plans and scans);
* ``atomic()`` around a one-row ``INSERT`` and around ``SELECT 1``, as references.

Per statement: the median latency, and the PostgreSQL CPU (``/proc/<backend pid>/stat``;
Linux, server on this machine) and Python CPU per execution; per comparison, the
difference. CPU time is what the machine's other work disturbs least. Usage::

    python benchmarks/statements.py --requests 2000
    python benchmarks/statements.py --partitions 30     # 30 more day partitions first
"""

from __future__ import annotations

import argparse
import datetime as dt
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
    from django_idempotency.store import Scope, StoredResponse, rows
    from django_idempotency.store.sql import PG_PARTITIONED_CLAIM_SQL

    cursor = connection.cursor()
    cursor.execute("SELECT pg_backend_pid()")
    backend = cursor.fetchone()[0]
    today = dt.date.today()
    from django_idempotency.retention import partitions as day_partitions

    for days in range(1, args.partitions + 1):
        day_partitions.ensure(connection, today - dt.timedelta(days=days))
    cursor.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'django_idempotency_record'::regclass"
    )
    partitions = cursor.fetchone()[0]
    tick = os.sysconf("SC_CLK_TCK")

    def backend_cpu() -> float:
        fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    def claim_params() -> dict[str, Any]:
        scope = Scope("bench", "POST /v1/workers", str(uuid.uuid4()))
        return rows.pg_params(
            scope,
            fingerprint="f" * 64,
            token=uuid.uuid4(),
            lease=60.0,
            retention=86400.0,
            take=False,
            test=False,
            request_path="/v1/workers",
        )

    response = StoredResponse(201, [("Content-Type", "application/json")], b'{"id": "w"}' * 40)

    def new_claim() -> store.Claim:
        won = store.claim(Scope("bench", "POST /c", str(uuid.uuid4())), "f" * 64, lease=60,
                          retention=86400)  # fmt: skip
        assert isinstance(won, store.Claim)
        return won

    def complete(claim: store.Claim) -> None:
        with transaction.atomic():
            store.complete(claim, response)

    def compare(
        label: str,
        shipped: Callable[[], object],
        without: Callable[[], object],
        saved_by: str = "the mechanism",
    ) -> None:
        """``shipped`` and ``without`` interleaved in blocks of 50; one row each."""
        sides = {"as shipped": shipped, "without": without}
        times: dict[str, list[float]] = {name: [] for name in sides}
        cpu = dict.fromkeys(sides, (0.0, 0.0))
        for step in sides.values():  # warm-up
            for _ in range(50):
                step()
        blocks = max(1, args.requests // 50)
        for number in range(blocks):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            for name in order:
                step = sides[name]
                db, py = backend_cpu(), time.process_time()
                for _ in range(50):
                    started = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - started)
                spent_db, spent_py = cpu[name]
                cpu[name] = (spent_db + backend_cpu() - db, spent_py + time.process_time() - py)
        per = {}
        for name in sides:
            n = len(times[name]) / 1000
            per[name] = (statistics.median(times[name]) * 1000, cpu[name][0] / n, cpu[name][1] / n)
            print(f"| {label}, {name} | " + " | ".join(f"{v:.3f}" for v in per[name]) + " |")
        saved = [b - a for a, b in zip(per["as shipped"], per["without"], strict=True)]
        print(f"| {label}: saved by {saved_by} | " + " | ".join(f"{v:+.3f}" for v in saved) + " |")

    print(f"PostgreSQL, {partitions} day partitions, {args.requests} executions each\n")
    print("| statement | median ms | PostgreSQL CPU ms | Python CPU ms |")
    print("| --- | ---: | ---: | ---: |")

    def empty_block() -> None:
        with transaction.atomic():
            cursor.execute("SELECT 1")

    compare(
        "the claim / atomic() around SELECT 1",
        lambda: cursor.execute(PG_PARTITIONED_CLAIM_SQL, claim_params()),
        empty_block,
        saved_by="the reference (negative: the claim's own cost)",
    )
    claims = iter([new_claim() for _ in range(args.requests + 50 + 50)])
    compare(
        "the completion in its atomic() block / atomic() around SELECT 1",
        lambda: complete(next(claims)),
        empty_block,
        saved_by="the reference (negative: the completion's own cost)",
    )

    def reference_insert() -> None:
        with transaction.atomic():
            cursor.execute(
                "INSERT INTO workers_worker (id, owner_id, image, cpu, memory_gb, labels, state,"
                " reboots, vm_id, created_at) SELECT substr(md5(random()::text), 1, 9), id, 'b',"
                " 1, 1, '{}'::jsonb, 'running', 0, '', now() FROM auth_user LIMIT 1"
            )

    compare("reference: atomic() around one INSERT / around SELECT 1", reference_insert,
            empty_block)  # fmt: skip
    cursor.close()


if __name__ == "__main__":
    sys.exit(main())
