"""Completions in place: the record table's fillfactor against HOT updates, over HTTP.

Not a test: a measurement. The completion writes the response into the row its claim
inserted. When the row's page has room for the new version, PostgreSQL makes it a HOT
update: no new entry in any of the table's four indexes. A page filled by the claims of
other requests has none, unless the table keeps some of each page free for updates
(``fillfactor``; docs/retention.md#storage-parameters).

For each ``--fillfactors`` value and each run: a throwaway PostgreSQL database,
migrated (the day-partitioned table, or the plain one with ``--plain``), every record
table set to that fillfactor (``ALTER TABLE ... SET``, as an operator would), then
benchmarks/minimal_view.py's server (gunicorn, ``minimal_app``) and ``--clients``
threads sending ``--requests`` keyed first executions to ``POST /items-padded``, whose
201 carries ``--pad`` more bytes. Once the server has stopped (its sessions' statistics
are flushed when they end), it reads from ``pg_stat_user_tables`` the share of updates
that were HOT, and the heap and index bytes per 1,000 records of the tables written
to (the empty days ahead left out). Usage::

    python benchmarks/fillfactor.py                              # 100 90 80 75, 3 runs
    python benchmarks/fillfactor.py --fillfactors 100 75 --pad 300 --plain

Needs gunicorn, httpx and psycopg (the example extra).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_bench import load  # noqa: E402
from minimal_view import BODY, MinimalServer, prepare, server_env  # noqa: E402

from storm.server import SetupError, ThrowawayDatabase  # noqa: E402

STATS = """
SELECT coalesce(sum(s.n_tup_upd), 0), coalesce(sum(s.n_tup_hot_upd), 0),
       coalesce(sum(pg_relation_size(s.relid)), 0), coalesce(sum(pg_indexes_size(s.relid)), 0)
FROM pg_stat_user_tables s
WHERE (s.relname = 'django_idempotency_record'
       OR s.relname LIKE 'django\\_idempotency\\_record\\_p%')
  AND s.n_tup_ins > 0  -- the tables the requests wrote to, not the empty days ahead
"""


def record_tables(db: ThrowawayDatabase) -> list[str]:
    """The record table's leaves: the plain table, or every day partition."""
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND "
            "(relname = 'django_idempotency_record' OR "
            "relname LIKE 'django\\_idempotency\\_record\\_p%')"
        ).fetchall()
    return [name for (name,) in rows]


def one_run(admin_url: str, fillfactor: int, args: argparse.Namespace) -> dict[str, float]:
    db = ThrowawayDatabase(admin_url)
    db.create()
    try:
        env = server_env(db.url)
        if args.plain:
            env["BENCH_PARTITIONED"] = "false"
        token = prepare(env)
        with db.connect() as conn:
            for name in record_tables(db):
                conn.execute(f"ALTER TABLE {name} SET (fillfactor = {fillfactor})")
        server = MinimalServer(env, workers=args.workers, threads=args.threads)
        try:
            server.start(token)
            cell = load(
                server.url, "keyed", args.clients, args.requests, [],
                path=f"/items-padded?pad={args.pad}", data=BODY, token=token,
            )  # fmt: skip
        finally:
            server.stop()
            server.log.unlink(missing_ok=True)
        if cell.errors:
            raise SetupError(f"{cell.errors} requests failed")
        deadline = time.monotonic() + 30
        with db.connect() as conn:
            while True:  # the server's sessions flush their statistics as they end
                conn.execute("SELECT pg_stat_clear_snapshot()")
                updated, hot, heap, indexes = map(int, conn.execute(STATS).fetchone())
                if updated >= args.requests or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        per = 1000 / args.requests
        return {
            "hot": hot / updated if updated else float("nan"),
            "heap_kib": heap / 1024 * per,
            "index_kib": indexes / 1024 * per,
            "rps": cell.rps,
        }
    finally:
        db.drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="an admin connection; throwaway databases are created beside it",
    )
    parser.add_argument("--fillfactors", type=int, nargs="+", default=[100, 90, 80, 75])
    parser.add_argument("--plain", action="store_true", help="the plain table, not partitioned")
    parser.add_argument("--pad", type=int, default=1000, help="bytes added to each response")
    parser.add_argument("--clients", type=int, default=8, help="client threads")
    parser.add_argument("--requests", type=int, default=2000, help="keyed requests per run")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn process")
    parser.add_argument("--runs", type=int, default=3, help="runs per fillfactor, interleaved")
    args = parser.parse_args(argv)
    kind = "plain" if args.plain else "partitioned"
    print(
        f"fillfactor: {kind} table, {args.requests} keyed requests x {args.runs} runs, "
        f"{args.clients} clients, responses padded by {args.pad} B; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    found: dict[int, list[dict[str, float]]] = {ff: [] for ff in args.fillfactors}
    try:
        for _run in range(args.runs):
            for fillfactor in args.fillfactors:
                found[fillfactor].append(one_run(args.database_url, fillfactor, args))
    except SetupError as exc:
        print(f"fillfactor: {exc}", file=sys.stderr)
        return 2
    print()
    print(
        "| fillfactor | HOT completions (min-max) | heap KiB per 1,000 records "
        "| indexes KiB per 1,000 | requests/s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for fillfactor, runs in found.items():
        hot = [r["hot"] for r in runs]
        print(
            f"| {fillfactor} | {statistics.median(hot):.0%} ({min(hot):.0%}-{max(hot):.0%}) "
            f"| {statistics.median(r['heap_kib'] for r in runs):,.0f} "
            f"| {statistics.median(r['index_kib'] for r in runs):,.0f} "
            f"| {statistics.median(r['rps'] for r in runs):,.0f} |"
        )
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
