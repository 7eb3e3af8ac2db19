"""Does a request cost more when the record table is big? Empty against N records, one run.

Not a test: a measurement. Two throwaway PostgreSQL databases, migrated alike (the
day-partitioned table, or the plain one with ``--plain``, as ``PARTITION_RECORDS =
False`` makes it): one stays empty, the other is filled with ``--records`` completed
records spread evenly over the last ``--window`` seconds (7 days by default, the default
``MAX_RETENTION``), so every one is still inside its window and none is swept. The rows
look like production's: UUID keys, ``--principals`` users, ``--endpoints`` endpoints
(one of them the benchmark's own ``POST /items``), response bodies of 300 B to 2 KB
(incompressible hex, so TOAST does not shrink them). The fill runs on the server
(``INSERT ... SELECT generate_series``, in chunks of ``--chunk`` rows, two connections
at once); it is followed by ``VACUUM (ANALYZE)`` and a ``CHECKPOINT`` on both databases.

Then benchmarks/minimal_view.py's server (gunicorn, ``minimal_app``) runs once per
database and the two are measured side by side: in each round every mode (unkeyed,
keyed first execution, replay) on both servers, the order alternating between rounds.
Last, the claim alone (``store.claim``, a new key each time, committed), in blocks of
``--claims`` alternating between the two databases. It prints the fill's time, the table
and index bytes per million records, requests/s, p50/p99, keyed / unkeyed on each
database and its ratio full / empty, and the claim's p50/p99 on each. Usage::

    python benchmarks/scale.py --records 1000000               # partitioned table
    python benchmarks/scale.py --records 1000000 --plain       # PARTITION_RECORDS = False
    python benchmarks/scale.py --records 10000000 --rounds 5 --json /tmp/scale.json

``--keep`` leaves both databases in place (their names are printed) for EXPLAIN.
Needs gunicorn, httpx and psycopg (the example extra), and disk: about 1.5 GB per
million records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_bench import Cell, cpu_sample, load, percentile, prepare_replays  # noqa: E402
from minimal_view import BODY, PATH, MinimalServer, prepare, server_env, summary  # noqa: E402
from scale_fill import fill, settle, sizes, token_of  # noqa: E402

from storm.server import SetupError, ThrowawayDatabase  # noqa: E402

MODES = ("unkeyed", "keyed", "replay")


def time_claims(empty: str, full: str, *, block: int, blocks: int) -> dict[str, list[float]]:
    """``store.claim`` of new keys in alternating blocks on both databases: latencies (s).

    Runs in this process with Django configured for the two databases (aliases
    ``empty`` and ``full``), as the app claims: its own transaction, committed. Each
    claim is released after it is timed, which frees its owner-presence lock (a session
    lock: thousands held at once would fill the server's lock table).
    """
    import django
    import environ
    from django.conf import settings

    if not settings.configured:
        env = environ.Env()
        settings.configure(
            DATABASES={"default": env.db_url_config(empty), "full": env.db_url_config(full)},
            INSTALLED_APPS=[
                "django.contrib.contenttypes",
                "django.contrib.auth",
                "django_idempotency",
            ],
            USE_TZ=True,
            IDEMPOTENCY={"OUTBOX_KICK": False},
        )
        django.setup()
    from django_idempotency import store

    latencies: dict[str, list[float]] = {"empty": [], "full": []}
    fingerprint = "a" * 64
    for number in range(blocks + 1):  # the first pair of blocks warms up
        order = ("default", "full") if number % 2 == 0 else ("full", "default")
        for alias in order:
            taken = []
            for _ in range(block):
                scope = store.Scope("auth.user:1", "POST /items", str(uuid.uuid4()))
                started = time.perf_counter()
                won = store.claim(scope, fingerprint, lease=60, retention=86400, using=alias)
                taken.append(time.perf_counter() - started)
                if isinstance(won, store.Claim):
                    store.release(won)
            if number:
                latencies["empty" if alias == "default" else "full"].extend(taken)
    return latencies


def measure(
    envs: dict[str, dict[str, str]], tokens: dict[str, str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every mode on both servers, side by side in each round; the summary rows."""
    servers = {
        name: MinimalServer(env, workers=args.workers, threads=args.threads)
        for name, env in envs.items()
    }
    rows: list[dict[str, Any]] = []
    try:
        for name, server in servers.items():
            server.start(tokens[name])
        replays = {}
        for name, server in servers.items():
            request = {"data": BODY, "token": tokens[name]}
            replays[name] = prepare_replays(server.url, args.clients, path=PATH, **request)  # type: ignore[arg-type]
            for mode in MODES:
                load(server.url, mode, args.clients, args.warmup, replays[name], **request)  # type: ignore[arg-type]
        cells: dict[tuple[str, str], list[Cell]] = {(n, m): [] for n in servers for m in MODES}
        for number in range(args.rounds):
            names = list(servers) if number % 2 == 0 else list(reversed(servers))
            for name in names:
                server = servers[name]
                request = {"data": BODY, "token": tokens[name]}
                for mode in MODES if number % 2 == 0 else tuple(reversed(MODES)):
                    before = cpu_sample([server])
                    cell = load(
                        server.url, mode, args.clients, args.requests, replays[name], **request
                    )  # type: ignore[arg-type]
                    after = cpu_sample([server])
                    per = {k: (after[k] - before[k]) * 1000 / cell.requests for k in before}
                    cell.cpu_server_ms, cell.cpu_db_ms = per["server"], per["db"]
                    cell.cpu_client_ms = per["client"]
                    cell.database = name
                    cells[(name, mode)].append(cell)
        for (name, mode), found in cells.items():
            row = summary(args.clients, mode, found)
            row["database"] = name
            rows.append(row)
    finally:
        for server in servers.values():
            server.stop()
            server.log.unlink(missing_ok=True)
    return rows


def ratios(rows: list[dict[str, Any]], claims: dict[str, list[float]]) -> dict[str, float]:
    """keyed / unkeyed on each database, full over empty; the claim's p99 likewise."""
    by = {(r["database"], r["mode"]): r for r in rows}
    keyed = {n: by[(n, "keyed")]["rps"] / by[(n, "unkeyed")]["rps"] for n in ("empty", "full")}
    p99 = {n: percentile(v, 0.99) * 1000 for n, v in claims.items()}
    return {
        "keyed_unkeyed_empty": keyed["empty"],
        "keyed_unkeyed_full": keyed["full"],
        "keyed_unkeyed_full_over_empty": keyed["full"] / keyed["empty"],
        "claim_p99_empty_ms": p99["empty"],
        "claim_p99_full_ms": p99["full"],
        "claim_p99_full_over_empty": p99["full"] / p99["empty"],
    }


def markdown(rows: list[dict[str, Any]], claims: dict[str, list[float]]) -> str:
    lines = [
        "| table | request | requests/s (range) | p50 ms | p99 ms | CPU ms/request |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    by = {(r["database"], r["mode"]): r for r in rows}
    for r in rows:
        cpu = r["cpu_server_ms"] + r["cpu_db_ms"] + r["cpu_client_ms"]
        lines.append(
            f"| {r['database']} | {r['mode']} | {r['rps']:.0f} ({r['rps_min']:.0f}-"
            f"{r['rps_max']:.0f}) | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {cpu:.2f} |"
        )
    ratio = {
        name: by[(name, "keyed")]["rps"] / by[(name, "unkeyed")]["rps"]
        for name in ("empty", "full")
    }
    p99 = {name: by[(name, "keyed")]["p99_ms"] for name in ("empty", "full")}
    claim = {
        name: (percentile(v, 0.5) * 1000, percentile(v, 0.99) * 1000) for name, v in claims.items()
    }
    lines += [
        "",
        "| | empty | full | full / empty |",
        "| --- | ---: | ---: | ---: |",
        f"| keyed / unkeyed (requests/s) | {ratio['empty']:.3f} | {ratio['full']:.3f} "
        f"| {ratio['full'] / ratio['empty']:.3f} (goal >= 0.95) |",
        f"| keyed request p99 ms | {p99['empty']:.2f} | {p99['full']:.2f} "
        f"| {p99['full'] / p99['empty']:.2f} |",
        f"| claim p50 ms | {claim['empty'][0]:.3f} | {claim['full'][0]:.3f} "
        f"| {claim['full'][0] / claim['empty'][0]:.2f} |",
        f"| claim p99 ms | {claim['empty'][1]:.3f} | {claim['full'][1]:.3f} "
        f"| {claim['full'][1] / claim['empty'][1]:.2f} (goal <= 1.2) |",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL admin URL; two throwaway databases are created there and dropped",
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the full table")
    parser.add_argument("--plain", action="store_true", help="the plain table, not partitioned")
    parser.add_argument("--window", type=float, default=7 * 86400.0, help="seconds spanned")
    parser.add_argument("--principals", type=int, default=3000)
    parser.add_argument("--endpoints", type=int, default=40)
    parser.add_argument("--chunk", type=int, default=250_000, help="rows per fill statement")
    parser.add_argument("--clients", type=int, default=8, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn processes per server")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn process")
    parser.add_argument("--requests", type=int, default=600, help="requests per measurement")
    parser.add_argument("--warmup", type=int, default=100, help="requests per mode to warm up")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is kept")
    parser.add_argument("--runs", type=int, default=1, help="measurements of the one fill")
    parser.add_argument("--claims", type=int, default=200, help="claims per block")
    parser.add_argument("--claim-blocks", type=int, default=20, help="blocks per database")
    parser.add_argument(
        "--explain", type=int, default=0, help="then this many claims explained (scale_explain)"
    )
    parser.add_argument("--keep", action="store_true", help="do not drop the databases")
    parser.add_argument(
        "--reuse",
        nargs=2,
        metavar=("EMPTY", "FULL"),
        help="measure two databases left by --keep (names on --database-url's server)",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kind = "plain" if args.plain else "partitioned"
    print(
        f"scale: {args.records:,} records, {kind} table, {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    dbs = {
        "empty": ThrowawayDatabase(args.database_url),
        "full": ThrowawayDatabase(args.database_url),
    }
    result: dict[str, Any] = {"records": args.records, "table": kind}
    try:
        with contextlib.ExitStack() as stack:
            for name, db in dbs.items():
                if args.reuse:
                    db.name = args.reuse[name == "full"]
                    db.url = db.url.rsplit("/", 1)[0] + "/" + db.name
                else:
                    db.create()
                if not args.keep:
                    stack.callback(db.drop)
            envs = {name: server_env(db.url) for name, db in dbs.items()}
            for env in envs.values():
                env["BENCH_PARTITIONED"] = "false" if args.plain else "true"
            seconds = 0.0
            if args.reuse:
                tokens = {name: token_of(db.url) for name, db in dbs.items()}
            else:
                tokens = {name: prepare(env) for name, env in envs.items()}
                seconds = fill(
                    dbs["full"].url,
                    args.records,
                    window=args.window,
                    principals=args.principals,
                    endpoints=args.endpoints,
                    chunk=args.chunk,
                )
            started = time.perf_counter()
            for db in dbs.values():
                settle(db.url)
            vacuum = time.perf_counter() - started
            size = sizes(dbs["full"].url)
            million = size["rows"] / 1e6
            result.update(fill_seconds=seconds, vacuum_seconds=vacuum, **size)
            mib = {k: size[k] / million / 2**20 for k in ("table_bytes", "index_bytes")}
            print(
                f"  filled {size['rows']:,} rows in {seconds:.0f} s, VACUUM (ANALYZE) + "
                f"CHECKPOINT {vacuum:.0f} s; per million records: table "
                f"{mib['table_bytes']:.0f} MiB, indexes {mib['index_bytes']:.0f} MiB",
                flush=True,
            )
            if args.keep:
                print(f"  databases kept: {dbs['empty'].name} (empty), {dbs['full'].name} (full)")
            runs = []
            for number in range(args.runs):
                before = " ".join(f"{x:.2f}" for x in os.getloadavg())
                rows = measure(envs, tokens, args)
                claims = time_claims(
                    dbs["empty"].url, dbs["full"].url, block=args.claims, blocks=args.claim_blocks
                )
                after = " ".join(f"{x:.2f}" for x in os.getloadavg())
                print(f"\nrun {number + 1}: load average {before} before, {after} after\n")
                print(markdown(rows, claims), flush=True)
                runs.append(
                    {
                        "load_before": before,
                        "load_after": after,
                        "rows": rows,
                        "claims": {
                            k: {
                                "p50": percentile(v, 0.5),
                                "p99": percentile(v, 0.99),
                                "mean": statistics.fmean(v),
                            }
                            for k, v in claims.items()
                        },
                        **ratios(rows, claims),
                    }
                )
            if args.explain:
                import scale_explain

                explained = {
                    n: scale_explain.explain(db.url, args.explain) for n, db in dbs.items()
                }
                print("\n" + scale_explain.markdown(explained), flush=True)
                result["explain"] = explained
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(
        "\n| run | keyed / unkeyed: empty | full | full / empty | claim p99 ms: empty "
        "| full | full / empty | load average |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for number, run in enumerate(runs, 1):
        print(
            f"| {number} | {run['keyed_unkeyed_empty']:.3f} | {run['keyed_unkeyed_full']:.3f} "
            f"| {run['keyed_unkeyed_full_over_empty']:.3f} | {run['claim_p99_empty_ms']:.2f} "
            f"| {run['claim_p99_full_ms']:.2f} | {run['claim_p99_full_over_empty']:.2f} "
            f"| {run['load_before']} / {run['load_after']} |"
        )
    if args.json:
        result["runs"] = runs
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
