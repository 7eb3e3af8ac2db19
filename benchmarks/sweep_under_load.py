"""Does a sweep stall requests? Keyed requests over HTTP while the sweeper runs.

Not a test: a measurement. One throwaway PostgreSQL database per table kind
(partitioned, then plain with ``PARTITION_RECORDS = False``), filled on the server
(``scale_fill.fill``) with ``--live`` records inside their window and ``--expired`` records
whose window ended on one past day. benchmarks/minimal_view.py's server (gunicorn,
``minimal_app``) answers ``--clients`` client threads sending keyed first executions
without pause. After ``--before`` seconds the sweeper runs in a process of its own
(``retention.sweep()``, as the ``idempotency_sweep`` command runs it): on the
partitioned table it drops the past day, on the plain table it deletes the expired
records in batches of ``SWEEP_BATCH_SIZE``. Then ``--expired`` sent outbox messages past
``OUTBOX_RETENTION`` are inserted and a second sweep deletes them (the sent messages'
cleanup), again under load.

Lock waits are measured two ways: a sampler thread reads ``pg_locks`` every
``--sample-ms`` ms and keeps, for every lock a session waited for, how long it had
waited when last seen (``now() - waitstart``); and the database runs with
``log_lock_waits = on`` and ``deadlock_timeout = 100ms``, so the server logs every wait
longer than 100 ms, which the script reads back from ``--server-log`` (lines of its
database only). The app's sessions are told apart by ``application_name``.

It prints, per sweep: what it did and its time, the requests before and during it
(count, errors, p50, p99, max), p99 during / before, the longest lock wait of an app
session and of the sweeper, and the server log's lock-wait lines. Usage::

    python benchmarks/sweep_under_load.py                       # 1 M expired records
    python benchmarks/sweep_under_load.py --tables partitioned --runs 3

Needs gunicorn, httpx and psycopg (the example extra), and a server log it can read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_bench import percentile  # noqa: E402
from minimal_view import BODY, PATH, MinimalServer, prepare, server_env  # noqa: E402
from scale_fill import connect, fill, settle  # noqa: E402

from storm.server import SetupError, ThrowawayDatabase  # noqa: E402

APP = "scale-app"
SWEEPER = "scale-sweeper"

#: Sent messages whose retention ended ``OUTBOX_RETENTION`` (7 days) and 3 more days ago.
OUTBOX = """
INSERT INTO django_idempotency_outbox (
    topic, payload, dedup_key, state, attempts, available_at, last_error, created_at, sent_at)
SELECT 'bench.sent', jsonb_build_object('n', n, 'note', repeat('x', 200)), 'sent-' || n,
       'sent', 1, t, '', t, t
FROM generate_series(1, %(rows)s) n,
     LATERAL (SELECT statement_timestamp() - interval '10 days'
                     - n * interval '10 milliseconds') AS s(t)
"""

#: Locks sessions wait for, with how long they have waited so far.
WAITING = """
SELECT l.pid, a.application_name, l.locktype, l.mode, l.relation::regclass::text,
       l.waitstart, EXTRACT(EPOCH FROM clock_timestamp() - l.waitstart)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database() AND l.waitstart IS NOT NULL
"""


class Load:
    """``clients`` threads sending keyed first executions until stopped; every request kept."""

    def __init__(self, url: str, token: str, clients: int) -> None:
        self.url, self.token, self.clients = url, token, clients
        self.stop = threading.Event()
        self.requests: list[tuple[float, float, bool]] = []  # (start, end, ok), monotonic
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.worker) for _ in range(clients)]

    def worker(self) -> None:
        headers = {"Authorization": f"Token {self.token}"}
        payload = json.dumps(BODY).encode()
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            while not self.stop.is_set():
                key = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"}
                started = time.monotonic()
                try:
                    ok = client.post(PATH, content=payload, headers=key).status_code == 201
                except httpx.HTTPError:
                    ok = False
                with self.lock:
                    self.requests.append((started, time.monotonic(), ok))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


class LockSampler(threading.Thread):
    """Samples ``pg_locks`` every ``interval`` s: the longest wait seen of each lock wait."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.stop = threading.Event()
        self.waits: dict[tuple[int, Any, str], dict[str, Any]] = {}
        self.samples = 0

    def run(self) -> None:
        with connect(self.url) as conn:
            conn.execute("SET application_name = 'scale-sampler'")
            while not self.stop.wait(self.interval):
                self.samples += 1
                for pid, app, locktype, mode, relation, start, waited in conn.execute(WAITING):
                    entry = self.waits.setdefault(
                        (pid, start, mode),
                        {"app": app, "lock": f"{mode} on {locktype} {relation or ''}".strip()},
                    )
                    entry["seconds"] = float(waited)

    def longest(self, app: str) -> tuple[float, str]:
        found = [(w["seconds"], w["lock"]) for w in self.waits.values() if w["app"] == app]
        return max(found, default=(0.0, "-"))


def sweep_child() -> None:
    """In the sweeper's process: one ``retention.sweep()``; its interval and report as JSON."""
    import django

    django.setup()
    from django_idempotency import retention

    started = time.monotonic()
    report = retention.sweep()
    ended = time.monotonic()
    print(json.dumps({"start": started, "end": ended, "report": report.as_dict()}))


def run_sweep(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--sweep-child"],
        env={**env, "PGAPPNAME": SWEEPER},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise SetupError(f"the sweep failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def stats(requests: list[tuple[float, float, bool]]) -> dict[str, float]:
    latencies = [end - start for start, end, _ in requests]
    if not latencies:
        return {"count": 0, "errors": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "count": len(latencies),
        "errors": sum(not ok for *_, ok in requests),
        "p50": percentile(latencies, 0.5) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "max": max(latencies) * 1000,
    }


def swept_under_load(
    env: dict[str, str], server: MinimalServer, token: str, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Load for ``--before`` s, then a sweep, then ``--after`` s; requests and lock waits."""
    sampler = LockSampler(url, args.sample_ms / 1000)
    sampler.start()
    with Load(server.url, token, args.clients) as load:
        time.sleep(args.before)  # a duration to measure, not a synchronisation
        swept = run_sweep(env)
        time.sleep(args.after)
    sampler.stop.set()
    sampler.join()
    start, end = swept["start"], swept["end"]
    before = [r for r in load.requests if r[1] < start and r[0] >= start - args.before + 2]
    during = [r for r in load.requests if r[0] < end and r[1] > start]
    return {
        "report": swept["report"],
        "sweep_seconds": end - start,
        "before": stats(before),
        "during": stats(during),
        "app_wait": sampler.longest(APP),
        "sweeper_wait": sampler.longest(SWEEPER),
        "samples": sampler.samples,
    }


def server_log_waits(path: Path, offset: int, database: str) -> list[str]:
    """Lines of ``database`` logged after ``offset`` about a lock wait (log_lock_waits)."""
    with path.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return [
        line
        for line in text.splitlines()
        if f"@{database} " in line and ("still waiting for" in line or "acquired" in line)
    ]


def one_table(kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    db = ThrowawayDatabase(args.database_url)
    db.create()
    try:
        with connect(args.database_url) as admin:
            admin.execute(f'ALTER DATABASE "{db.name}" SET log_lock_waits = on')
            admin.execute(f"ALTER DATABASE \"{db.name}\" SET deadlock_timeout = '100ms'")
        env = server_env(db.url)
        env["BENCH_PARTITIONED"] = "true" if kind == "partitioned" else "false"
        token = prepare(env)
        day = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        common = {"principals": args.principals, "endpoints": 40, "chunk": 250_000}
        fill(db.url, args.live, window=86400.0, **common)
        # The expired records' windows end on one day, three days ago (01:00 to 21:00).
        filled = fill(
            db.url,
            args.expired,
            window=20 * 3600.0,
            now=day - dt.timedelta(days=3, hours=-1),
            **common,
        )
        settle(db.url)
        print(
            f"  {kind}: {args.live:,} live and {args.expired:,} expired records "
            f"filled in {filled:.0f} s",
            flush=True,
        )
        server = MinimalServer({**env, "PGAPPNAME": APP}, workers=args.workers, threads=8)
        log_offset = args.server_log.stat().st_size
        results = []
        try:
            server.start(token)
            print(f"    load average before: {os.getloadavg()}", flush=True)
            results.append(
                {
                    "table": kind,
                    "sweep": "records",
                    **swept_under_load(env, server, token, db.url, args),
                }
            )
            with connect(db.url) as conn:
                conn.execute(OUTBOX, {"rows": args.expired})
            settle(db.url)
            results.append(
                {
                    "table": kind,
                    "sweep": "sent outbox messages",
                    **swept_under_load(env, server, token, db.url, args),
                }
            )
            print(f"    load average after: {os.getloadavg()}", flush=True)
        finally:
            server.stop()
            server.log.unlink(missing_ok=True)
        logged = server_log_waits(args.server_log, log_offset, db.name)
        for result in results:
            result["server_log"] = logged
        return results
    finally:
        db.drop()


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| table | sweep | what it did | sweep s | requests before / during | errors "
        "| p99 ms before | p99 ms during | during / before | max ms during "
        "| longest lock wait: app | sweeper |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        rep = r["report"]
        did = (
            f"{len(rep['dropped'])} day(s) dropped, {rep['deleted_records']:,} records, "
            f"{rep['deleted_outbox']:,} messages deleted"
        )
        b, d = r["before"], r["during"]
        app, swp = r["app_wait"], r["sweeper_wait"]
        lines.append(
            f"| {r['table']} | {r['sweep']} | {did} | {r['sweep_seconds']:.2f} "
            f"| {b['count']} / {d['count']} | {b['errors'] + d['errors']} | {b['p99']:.1f} "
            f"| {d['p99']:.1f} | {d['p99'] / b['p99']:.2f} | {d['max']:.1f} "
            f"| {app[0] * 1000:.0f} ms ({app[1]}) | {swp[0] * 1000:.0f} ms ({swp[1]}) |"
        )
    logged = {line for r in results for line in r["server_log"]}
    lines += ["", f"Lock waits over 100 ms in the server log: {len(logged)}"]
    lines += [f"    {line}" for line in sorted(logged)[:20]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL admin URL; a throwaway database is created there and dropped",
    )
    parser.add_argument("--tables", default="partitioned,plain", help="comma-separated kinds")
    parser.add_argument("--expired", type=int, default=1_000_000, help="records to sweep")
    parser.add_argument("--live", type=int, default=200_000, help="records inside their window")
    parser.add_argument("--principals", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=8, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--before", type=float, default=15.0, help="seconds of load before")
    parser.add_argument("--after", type=float, default=2.0, help="seconds of load after")
    parser.add_argument("--sample-ms", type=float, default=5.0, help="pg_locks sampling period")
    parser.add_argument("--runs", type=int, default=1, help="runs per table kind")
    parser.add_argument(
        "--server-log", type=Path, default=Path("/var/log/postgresql/postgresql-15-main.log")
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--sweep-child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sweep_child:
        sweep_child()
        return 0
    print(f"sweep_under_load: {os.cpu_count()} CPUs, load average {os.getloadavg()}", flush=True)
    results: list[dict[str, Any]] = []
    try:
        for _ in range(args.runs):
            for kind in args.tables.split(","):
                results += one_table(kind, args)
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(f"load average at the end: {os.getloadavg()}\n")
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
