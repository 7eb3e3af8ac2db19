"""The hot path over real HTTP: what an Idempotency-Key costs a create, and what a replay saves.

Not a test: a measurement. It runs the leasebroker example on gunicorn (sync workers,
127.0.0.1 only) on PostgreSQL (a throwaway database, dropped after) and on SQLite (a
temporary file), and for 1 and 8 concurrent clients measures ``POST /v1/workers``:

* ``unkeyed``: no Idempotency-Key; the server runs with
  ``LEASEBROKER_IDEMPOTENCY_REQUIRED=false``, so the request runs unprotected (the
  baseline: the same view, as without the app). Both servers run the create as one
  transaction (``LEASEBROKER_CREATE_PHASES=false``), so keyed and unkeyed requests run
  the same view code and the difference is the protocol. The example's create is not one
  transaction on its own (its writes autocommit one by one: 3 commits);
* ``unkeyed-atomic``: the same on a second server with ``ATOMIC_REQUESTS``, so the
  unprotected view runs in one transaction (1 commit), the fairer baseline: a keyed
  request commits twice (the claim, then the view with its completion);
* ``keyed``: a fresh key on every request, so every request is a first execution
  (claim, view, fenced completion);
* ``replay``: every request repeats an already completed one (same key, same body):
  the stored response is replayed and the view does not run.

Each cell is the median of ``--rounds`` rounds of ``--requests`` requests (after a
warm-up); the modes alternate within a round so drift hits them alike. Output: a
Markdown table (requests/s, p50 and p99 latency in ms) and the two ratios the targets
are about, and the CPU time each request cost the gunicorn workers, PostgreSQL and the
client (Linux ``/proc``), which says where the time goes when the machine is CPU-bound;
``--json FILE`` saves the raw numbers. Usage::

    python benchmarks/http_bench.py                         # both databases, ~2 min
    python benchmarks/http_bench.py --databases postgres --clients 8 --rounds 5
    python benchmarks/http_bench.py --databases postgres --db-latency-ms 0.5  # a 1 ms round trip

Database connections are persistent (``conn_max_age``, as in production) unless
``--conn-max-age 0``. Needs gunicorn, httpx and psycopg (the example extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "example_project"))

from latency_proxy import behind_proxy  # noqa: E402  (benchmarks/, this script's folder)

from storm.server import (  # noqa: E402  (example_project/storm: server helpers)
    Gunicorn,
    SetupError,
    ThrowawayDatabase,
    manage,
)
from workers.demo_principals import DEMO_TOKENS  # noqa: E402

MODES = ("unkeyed", "unkeyed-atomic", "keyed", "replay")
PATH = "/v1/workers"
TOKEN = DEMO_TOKENS["alice"]


@dataclass
class Cell:
    database: str
    clients: int
    mode: str
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: CPU milliseconds per request: gunicorn workers, PostgreSQL processes, this client.
    cpu_server_ms: float = 0.0
    cpu_db_ms: float = 0.0
    cpu_client_ms: float = 0.0


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def cpu_sample(servers: list[Gunicorn]) -> dict[str, float]:
    """CPU seconds used so far by the servers' workers, PostgreSQL and this process.

    Linux ``/proc`` only (zeros elsewhere). PostgreSQL's processes are counted when
    they run on this machine (``postgres`` in their name); SQLite has none.
    """
    workers = {pid for server in servers for pid in server.worker_pids()}
    sample = {"server": 0.0, "db": 0.0, "client": _cpu_seconds(os.getpid())}
    if not Path("/proc").is_dir():
        return sample
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in workers:
            sample["server"] += _cpu_seconds(pid)
            continue
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("postgres"):
            sample["db"] += _cpu_seconds(pid)
    return sample


def body(run: str) -> dict[str, Any]:
    return {"image": "bench", "cpu": 1, "memory_gb": 1, "labels": {"bench": run}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def load(
    url: str,
    mode: str,
    clients: int,
    requests: int,
    replay_keys: list[str],
    *,
    path: str = PATH,
    data: dict[str, Any] | None = None,
    token: str = TOKEN,
) -> Cell:
    """Send ``requests`` requests from ``clients`` threads; measure throughput and latency.

    ``mode``: ``keyed``, ``floor`` or ``sql`` (a new key each time), ``replay`` (one
    completed key per client thread, from ``replay_keys``), anything else unkeyed. Every
    answer must be a 201, replayed exactly in ``replay`` mode; others count as errors.
    """
    per_thread = [requests // clients + (i < requests % clients) for i in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    payload = json.dumps(body("bench") if data is None else data).encode()
    barrier = threading.Barrier(clients + 1)

    def worker(index: int) -> None:
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            barrier.wait()
            for _ in range(per_thread[index]):
                extra = {}
                if mode in ("keyed", "floor", "sql"):
                    extra["Idempotency-Key"] = str(uuid.uuid4())
                elif mode == "replay":
                    extra["Idempotency-Key"] = replay_keys[index]
                started = time.perf_counter()
                response = client.post(path, content=payload, headers=extra)
                latencies[index].append(time.perf_counter() - started)
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                if response.status_code != 201 or replayed != (mode == "replay"):
                    errors[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    flat = [x for per in latencies for x in per]
    return Cell(
        database="",
        clients=clients,
        mode=mode,
        requests=len(flat),
        rps=len(flat) / wall,
        p50_ms=percentile(flat, 0.50) * 1000,
        p99_ms=percentile(flat, 0.99) * 1000,
        errors=sum(errors),
    )


def prepare_replays(
    url: str,
    count: int,
    *,
    path: str = PATH,
    data: dict[str, Any] | None = None,
    token: str = TOKEN,
) -> list[str]:
    """``count`` completed keyed creates; their keys (one per client thread)."""
    keys = [f"bench-replay-{uuid.uuid4()}" for _ in range(count)]
    headers = {"Authorization": f"Token {token}"}
    payload = body("bench") if data is None else data
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for key in keys:
            response = client.post(path, json=payload, headers={"Idempotency-Key": key})
            response.raise_for_status()
    return keys


def server_env(url: str, args: argparse.Namespace, *, atomic: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    options = f"conn_max_age={args.conn_max_age}" + ("&atomic_requests=true" if atomic else "")
    env.update(
        DJANGO_SETTINGS_MODULE="leasebroker.settings",
        DATABASE_URL=f"{url}{'&' if '?' in url else '?'}{options}",
        DEBUG="false",
        LEASEBROKER_IDEMPOTENCY_REQUIRED="false",
        # The create as one transaction, keyed or not: the benchmark measures the
        # protocol itself, not the extra commits of atomic phases (docs/phases.md).
        LEASEBROKER_CREATE_PHASES="false",
    )
    return env


def bench_database(name: str, url: str, args: argparse.Namespace) -> list[Cell]:
    """Both servers (as shipped, and with ATOMIC_REQUESTS) on one database; every cell."""
    env = server_env(url, args, atomic=False)
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "create_demo_principals")
    with contextlib.ExitStack() as stack:
        if args.db_latency_ms is not None and url.startswith("postgres"):
            # The servers' connections go through the proxy: a network between app and DB.
            _proxy, url = behind_proxy(stack, url, args.db_latency_ms)
        return serve_and_measure(name, url, args)


def serve_and_measure(name: str, url: str, args: argparse.Namespace) -> list[Cell]:
    """Start both servers on ``url`` and measure every cell."""
    server = Gunicorn(server_env(url, args, atomic=False), workers=args.server_workers)
    atomic = Gunicorn(server_env(url, args, atomic=True), workers=args.server_workers)
    cells: list[Cell] = []
    try:
        server.start(TOKEN)
        atomic.start(TOKEN)
        print(f"  {name}: gunicorn, {args.server_workers} sync workers each: {server.url}, ")
        print(f"    and {atomic.url} with ATOMIC_REQUESTS (mode unkeyed-atomic only)")
        urls = {mode: atomic.url if mode == "unkeyed-atomic" else server.url for mode in MODES}
        for clients in args.clients:
            replay_keys = prepare_replays(server.url, clients)
            for mode in MODES:  # warm every worker's connection and caches
                load(urls[mode], mode, clients, args.warmup, replay_keys)
            rounds: dict[str, list[Cell]] = {mode: [] for mode in MODES}
            for number in range(args.rounds):
                order = MODES if number % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    before = cpu_sample([server, atomic])
                    cell = load(urls[mode], mode, clients, args.requests, replay_keys)
                    after = cpu_sample([server, atomic])
                    per = {k: (after[k] - before[k]) * 1000 / cell.requests for k in before}
                    cell.cpu_server_ms, cell.cpu_db_ms = per["server"], per["db"]
                    cell.cpu_client_ms = per["client"]
                    rounds[mode].append(cell)
            for mode in MODES:
                cell = median_cell(rounds[mode])
                cell.database = name
                cells.append(cell)
                print(
                    f"    {clients} client(s) {mode:<14} {cell.rps:8.1f} req/s  "
                    f"p50 {cell.p50_ms:6.1f} ms  p99 {cell.p99_ms:6.1f} ms  errors {cell.errors}  "
                    f"CPU/request: server {cell.cpu_server_ms:.2f} db {cell.cpu_db_ms:.2f} "
                    f"client {cell.cpu_client_ms:.2f} ms"
                )
    finally:
        for gunicorn in (server, atomic):
            gunicorn.stop()
            gunicorn.log.unlink(missing_ok=True)
    return cells


def median_cell(cells: list[Cell]) -> Cell:
    """The round with the median throughput (latencies from the same round)."""
    ordered = sorted(cells, key=lambda c: c.rps)
    chosen = ordered[len(ordered) // 2]
    chosen.errors = sum(c.errors for c in cells)
    return chosen


def markdown(cells: list[Cell]) -> str:
    lines = [
        "| database | clients | request | requests/s | p50 ms | p99 ms "
        "| CPU ms/request: server | database | client |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    labels = {
        "unkeyed": "unkeyed (unprotected)",
        "unkeyed-atomic": "unkeyed, ATOMIC_REQUESTS",
        "keyed": "keyed, first execution",
        "replay": "keyed, replay",
    }
    for c in cells:
        lines.append(
            f"| {c.database} | {c.clients} | {labels[c.mode]} | {c.rps:.0f} | "
            f"{c.p50_ms:.1f} | {c.p99_ms:.1f} | {c.cpu_server_ms:.2f} | {c.cpu_db_ms:.2f} | "
            f"{c.cpu_client_ms:.2f} |"
        )
    lines.append("")
    lines.append(
        "| database | clients | keyed / unkeyed (target >= 0.85) | "
        "keyed / unkeyed-atomic | replay / keyed (target >= 1.5) |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    by = {(c.database, c.clients, c.mode): c for c in cells}
    for database, clients in dict.fromkeys((c.database, c.clients) for c in cells):
        keyed = by[(database, clients, "keyed")].rps
        unkeyed = by[(database, clients, "unkeyed")].rps
        atomic = by[(database, clients, "unkeyed-atomic")].rps
        replay = by[(database, clients, "replay")].rps
        lines.append(
            f"| {database} | {clients} | {keyed / unkeyed:.2f} | {keyed / atomic:.2f} | "
            f"{replay / keyed:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases", default="postgres,sqlite", help="comma-separated: postgres, sqlite"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL admin URL; a throwaway database is created there and dropped",
    )
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement")
    parser.add_argument("--warmup", type=int, default=40, help="requests per mode to warm up")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is kept")
    parser.add_argument("--server-workers", type=int, default=4, help="gunicorn processes")
    parser.add_argument(
        "--conn-max-age", type=int, default=600, help="seconds; 0: a new connection per request"
    )
    parser.add_argument(
        "--db-latency-ms",
        type=float,
        default=None,
        help="put the PostgreSQL servers' connections behind benchmarks/latency_proxy.py, "
        "delaying each direction by this many ms (0.5: a 1 ms round trip)",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    args.clients = [int(c) for c in args.clients.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"http_bench: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.requests} requests x {args.rounds} rounds, conn_max_age={args.conn_max_age}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    cells: list[Cell] = []
    try:
        for name in args.databases:
            if name == "postgres":
                db = ThrowawayDatabase(args.database_url)
                db.create()
                try:
                    cells += bench_database("PostgreSQL", db.url, args)
                finally:
                    db.drop()
            elif name == "sqlite":
                with tempfile.TemporaryDirectory(prefix="http-bench-") as tmp:
                    cells += bench_database("SQLite", f"sqlite:///{tmp}/bench.sqlite3", args)
            else:
                print(f"unknown database {name!r}: postgres or sqlite")
                return 2
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other work skews the numbers)")
    print(markdown(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
