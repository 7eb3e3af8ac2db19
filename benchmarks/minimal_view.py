"""What an Idempotency-Key costs the smallest view that does real work, over real HTTP.

Not a test: a measurement. The view (benchmarks/minimal_app) is a DRF ``APIView`` with
header-token authentication, a serializer and one INSERT in ``transaction.atomic()``,
answering 201 JSON with ``Location``. It runs on gunicorn (``gthread``, 2 workers x 8
threads, 127.0.0.1), with persistent connections (``CONN_MAX_AGE=300``, health checks)
to a throwaway PostgreSQL database, dropped after. Five kinds of request, interleaved
within each round (the order alternating between rounds), at 1 and 8 client threads:

* ``unkeyed``: no key; the same view runs unprotected (the baseline);
* ``keyed``: a new UUID key on every request, so every request is a first execution;
* ``replay``: a completed key again: the stored response, the view does not run;
* ``floor``: a new key on every request to the same view with a hand-written claim and
  completion and none of django_idempotency (``ItemCreateFloor``): the least a first
  execution can cost when its claim commits before the view, the yardstick of ``keyed``;
* ``sql``: a new key on every request to the same view sending django_idempotency's own
  claim and completion statements with the least Python (``ItemCreateSql``): what the
  app's SQL costs apart from its Python.

It prints requests/s (median of the rounds, and their range), p50 / p99 latency, the
CPU each request cost the gunicorn workers, PostgreSQL and the client (Linux ``/proc``),
the ratios of requests/s (keyed / unkeyed, replay / keyed, floor / unkeyed, keyed / floor,
sql / unkeyed), and the same ratios of CPU per request (all processes: unkeyed's CPU over
the mode's), which bound the throughput ratio where the machine is CPU bound (8 clients
on 2 cores) and vary less between runs. Usage::

    python benchmarks/minimal_view.py                  # 3 rounds of 600 requests per cell
    python benchmarks/minimal_view.py --rounds 5 --json /tmp/minimal.json
    python benchmarks/minimal_view.py --db-latency-ms 0.5   # a 1 ms round trip to PostgreSQL

Needs gunicorn, httpx and psycopg (the example extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_bench import Cell, cpu_sample, load, prepare_replays  # noqa: E402
from latency_proxy import behind_proxy  # noqa: E402

from storm.server import Gunicorn, SetupError, ThrowawayDatabase  # noqa: E402

MODES = ("unkeyed", "keyed", "replay", "floor", "sql")
PATH = "/items"
PATHS = {"floor": "/items-floor", "sql": "/items-sql"}
BODY = {"name": "widget", "size": 3}


class MinimalServer(Gunicorn):
    """benchmarks/minimal_app on gunicorn: gthread workers, persistent connections."""

    ready_path = PATH

    def __init__(self, env: dict[str, str], *, workers: int, threads: int) -> None:
        super().__init__(env, workers=workers)
        self.threads = threads

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "gunicorn", "minimal_app.wsgi:application"),
            *("--chdir", str(HERE), "--bind", f"127.0.0.1:{self.port}"),
            *("--workers", str(self.workers), "--threads", str(self.threads)),
            *("--worker-class", "gthread", "--timeout", "60", "--graceful-timeout", "5"),
        ]


def django_admin(env: dict[str, str], *command: str) -> str:
    """Run ``django-admin <command>`` with the benchmark's settings; its output.

    Raises:
        SetupError: the command failed.
    """
    done = subprocess.run(
        [sys.executable, "-m", "django", *command],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise SetupError(f"django-admin {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def prepare(env: dict[str, str]) -> str:
    """Migrate the throwaway database and create the benchmark's user; its token."""
    django_admin(env, "migrate", "--noinput", "-v", "0")
    script = (
        "from django.contrib.auth.models import User; "
        "from rest_framework.authtoken.models import Token; "
        "user = User.objects.create_user('bench'); "
        "print(Token.objects.create(user=user).key)"
    )
    return django_admin(env, "shell", "-c", script).strip().splitlines()[-1]  # after the banner


def server_env(url: str) -> dict[str, str]:
    """The benchmark servers' environment, on the database at ``url``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DJANGO_SETTINGS_MODULE="minimal_app.settings",
        DATABASE_URL=url,
        PYTHONPATH=os.pathsep.join(
            p for p in (str(HERE), str(HERE.parent), env.get("PYTHONPATH")) if p
        ),
    )
    return env


def run(url: str, args: argparse.Namespace) -> list[dict[str, object]]:
    env = server_env(url)
    token = prepare(env)
    with contextlib.ExitStack() as stack:
        if args.db_latency_ms is not None:
            # The app's connections go through the proxy: a network between app and DB.
            _proxy, env["DATABASE_URL"] = behind_proxy(stack, url, args.db_latency_ms)
        return measure(env, token, args)


def measure(env: dict[str, str], token: str, args: argparse.Namespace) -> list[dict[str, object]]:
    """Every mode at every client count against a fresh gunicorn; the summary rows."""
    server = MinimalServer(env, workers=args.workers, threads=args.threads)
    results: list[dict[str, object]] = []
    request = {"data": BODY, "token": token}
    try:
        server.start(token)
        print(f"  gunicorn gthread {args.workers} x {args.threads} on {server.url}")
        for clients in args.clients:
            replay_keys = prepare_replays(server.url, clients, path=PATH, **request)  # type: ignore[arg-type]
            for mode in MODES:  # warm every worker thread's connection and caches
                path = PATHS.get(mode, PATH)
                load(server.url, mode, clients, args.warmup, replay_keys, path=path, **request)  # type: ignore[arg-type]
            rounds: dict[str, list[Cell]] = {mode: [] for mode in MODES}
            for number in range(args.rounds):
                order = MODES if number % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    before = cpu_sample([server])
                    path = PATHS.get(mode, PATH)
                    cell = load(
                        server.url, mode, clients, args.requests, replay_keys, path=path, **request
                    )  # type: ignore[arg-type]
                    after = cpu_sample([server])
                    per = {k: (after[k] - before[k]) * 1000 / cell.requests for k in before}
                    cell.cpu_server_ms, cell.cpu_db_ms = per["server"], per["db"]
                    cell.cpu_client_ms = per["client"]
                    rounds[mode].append(cell)
            for mode in MODES:
                results.append(summary(clients, mode, rounds[mode]))
                row = results[-1]
                print(
                    f"    {clients} client(s) {mode:<8} {row['rps']:8.1f} req/s "
                    f"({row['rps_min']:.0f}-{row['rps_max']:.0f})  p50 {row['p50_ms']:5.2f} ms  "
                    f"errors {row['errors']}"
                )
    finally:
        server.stop()
        server.log.unlink(missing_ok=True)
    return results


def summary(clients: int, mode: str, cells: list[Cell]) -> dict[str, object]:
    """The median round (by requests/s), the range over the rounds, errors summed."""
    ordered = sorted(cells, key=lambda c: c.rps)
    median = ordered[len(ordered) // 2]
    row = asdict(median)
    row.update(
        clients=clients,
        mode=mode,
        rps_min=ordered[0].rps,
        rps_max=ordered[-1].rps,
        errors=sum(c.errors for c in cells),
        rounds=[asdict(c) for c in cells],
    )
    return row


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| clients | request | requests/s (range) | p50 ms | p99 ms "
        "| CPU ms/request: server | database | client |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    labels = {
        "unkeyed": "unkeyed",
        "keyed": "keyed, first execution",
        "replay": "replay",
        "floor": "floor (hand-written claim)",
        "sql": "the app's SQL, least Python",
    }
    for r in rows:
        lines.append(
            f"| {r['clients']} | {labels[str(r['mode'])]} | {r['rps']:.0f} "
            f"({r['rps_min']:.0f}-{r['rps_max']:.0f}) | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['cpu_server_ms']:.2f} | {r['cpu_db_ms']:.2f} | {r['cpu_client_ms']:.2f} |"
        )
    lines += [
        "",
        "| clients | ratio of | keyed / unkeyed (target >= 0.85) | replay / keyed (target >= 1.5) "
        "| floor / unkeyed | keyed / floor | sql / unkeyed |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rps = {(r["clients"], r["mode"]): float(r["rps"]) for r in rows}  # type: ignore[arg-type]
    # CPU per request, every process (server, database, client): its inverse is the
    # throughput a CPU-bound machine allows.
    cpu = {
        (r["clients"], r["mode"]): 1
        / (float(r["cpu_server_ms"]) + float(r["cpu_db_ms"]) + float(r["cpu_client_ms"]))  # type: ignore[arg-type]
        for r in rows
    }
    for clients in dict.fromkeys(r["clients"] for r in rows):
        for label, by in (("requests/s", rps), ("1 / CPU", cpu)):
            keyed, unkeyed, replay, floor, sql = (
                by[(clients, m)] for m in ("keyed", "unkeyed", "replay", "floor", "sql")
            )
            lines.append(
                f"| {clients} | {label} | {keyed / unkeyed:.2f} | {replay / keyed:.2f} "
                f"| {floor / unkeyed:.2f} | {keyed / floor:.2f} | {sql / unkeyed:.2f} |"
            )
    return "\n".join(lines)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the database, the gunicorn servers and the clients (shared)."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL admin URL; a throwaway database is created there and dropped",
    )
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn process")
    parser.add_argument(
        "--db-latency-ms",
        type=float,
        default=None,
        help="put the app's database connections behind benchmarks/latency_proxy.py, "
        "delaying each direction by this many ms (0.5: a 1 ms round trip; 0: the proxy alone, "
        "which also counts round trips)",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(parser)
    parser.add_argument("--requests", type=int, default=600, help="requests per measurement")
    parser.add_argument("--warmup", type=int, default=100, help="requests per mode to warm up")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is kept")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"minimal_view: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.requests} requests x {args.rounds} rounds, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    db = ThrowawayDatabase(args.database_url)
    try:
        db.create()
        try:
            rows = run(db.url, args)
        finally:
            db.drop()
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other work skews the numbers)")
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
