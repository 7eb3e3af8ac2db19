"""What each speed mechanism of the app gains: A/B on a view over real HTTP.

Not a test: a measurement. For each mechanism (``minimal_app/without.py`` names them)
it starts two gunicorn servers on one throwaway PostgreSQL database: **A** as shipped,
**B** with that one mechanism turned off (``BENCH_WITHOUT``). ``--app minimal`` (the
default) serves ``benchmarks/minimal_app`` (gthread workers); ``--app leasebroker``
serves the example project's create, ``POST /v1/workers``, from ``example_project/`` as
``http_bench.py`` does (sync workers, 4 by default; the create as one transaction; the
fake hypervisor's file and the Celery broker's folder in a temporary directory),
through ``leasebroker_wsgi.py``, which applies ``BENCH_WITHOUT`` in B's process. It
sends keyed first executions (a new ``Idempotency-Key`` each) to A and B in
alternating rounds (A B, B A, ...), so both see the same machine, and prints per
mechanism:

* the gain in throughput, A's requests/s over B's, minus 1 (the median of the rounds'
  ratios, and their range), at each client count;
* the gain in latency, B's p50 over A's, minus 1;
* the gain in CPU per request (gunicorn, PostgreSQL and the client added up);
* behind the latency proxy, the round trips to PostgreSQL per request of A and B
  (counted by ``latency_proxy.py``: chunks sent to the database).

``nothing`` is the control: B is A again, so its "gain" is the noise of the run. A
mechanism earns its place when its gain stands clear of the control's range, over
several runs (``--runs``). Usage::

    python benchmarks/mechanisms.py                          # loopback, 3 runs
    python benchmarks/mechanisms.py --db-latency-ms 0.5      # a 1 ms round trip
    python benchmarks/mechanisms.py --mechanisms cached_table_facts,nothing --runs 5
    python benchmarks/mechanisms.py --app leasebroker --db-latency-ms 0.5

Results and their reading: docs/contributing/performance.md. Needs gunicorn, httpx
and psycopg (the example extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_bench import PATH as LEASEBROKER_PATH  # noqa: E402
from http_bench import TOKEN as LEASEBROKER_TOKEN  # noqa: E402
from http_bench import body, cpu_sample, load  # noqa: E402
from http_bench import server_env as leasebroker_server_env  # noqa: E402
from latency_proxy import LatencyProxy, behind_proxy  # noqa: E402
from minimal_app.without import MECHANISMS  # noqa: E402
from minimal_view import (  # noqa: E402
    BODY,
    PATH,
    MinimalServer,
    add_server_arguments,
    prepare,
    server_env,
)

from storm.server import Gunicorn, SetupError, ThrowawayDatabase, manage  # noqa: E402
from workers.demo_principals import DEMO_TOKENS  # noqa: E402

APPS = ("minimal", "leasebroker")


class LeasebrokerServer(Gunicorn):
    """leasebroker as ``http_bench.py`` runs it, through ``leasebroker_wsgi.py``."""

    def start(self, token: str) -> None:
        # Ready when it lists bob's workers, which stay none: alice's list grows with
        # every create, past the readiness probe's timeout behind the latency proxy.
        super().start(DEMO_TOKENS["bob"])

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("leasebroker.wsgi:application")] = "leasebroker_wsgi:application"
        return command


def app_env(url: str, args: argparse.Namespace) -> dict[str, str]:
    """The environment of ``args.app``'s servers (and set-up) on the database at ``url``."""
    if args.app == "minimal":
        return server_env(url)
    env = leasebroker_server_env(url, args, atomic=False)
    env.update(
        # leasebroker_wsgi and minimal_app.without, then the package of this checkout.
        PYTHONPATH=os.pathsep.join(
            p for p in (str(HERE), str(HERE.parent), env.get("PYTHONPATH")) if p
        ),
        LEASEBROKER_HYPERVISOR_DB=str(args.var / "hypervisor.sqlite3"),
        LEASEBROKER_BROKER_DIR=str(args.var / "broker"),
    )
    return env


def app_server(env: dict[str, str], args: argparse.Namespace) -> Gunicorn:
    if args.app == "minimal":
        return MinimalServer(env, workers=args.workers, threads=args.threads)
    return LeasebrokerServer(env, workers=args.workers)


def prepare_app(url: str, args: argparse.Namespace) -> str:
    """Migrate the throwaway database and create the benchmark's user; its token."""
    env = app_env(url, args)
    if args.app == "minimal":
        return prepare(env)
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "create_demo_principals")
    return LEASEBROKER_TOKEN


def measure_pair(
    env: dict[str, str],
    token: str,
    mechanism: str,
    args: argparse.Namespace,
    proxy: LatencyProxy | None,
) -> dict[str, Any]:
    """A and B (``mechanism`` off) in alternating rounds; the ratios per client count."""
    servers = {
        "A": app_server(env, args),
        "B": app_server({**env, "BENCH_WITHOUT": mechanism}, args),
    }
    if args.app == "minimal":
        request = {"data": BODY, "token": token, "path": PATH}
    else:
        request = {"data": body("bench"), "token": token, "path": LEASEBROKER_PATH}
    out: dict[str, Any] = {"mechanism": mechanism, "clients": {}}
    try:
        for server in servers.values():
            server.start(token)
        for clients in args.clients:
            for server in servers.values():  # warm every worker thread's connection
                load(server.url, "keyed", clients, args.warmup, [], **request)  # type: ignore[arg-type]
            cells: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
            for number in range(args.rounds * 2):
                name = "AB"[number % 2] if (number // 2) % 2 == 0 else "BA"[number % 2]
                server = servers[name]
                before = cpu_sample([server])
                sent = proxy.sent() if proxy else 0
                cell = load(server.url, "keyed", clients, args.requests, [], **request)  # type: ignore[arg-type]
                after = cpu_sample([server])
                if cell.errors:
                    raise SetupError(f"{mechanism} {name}: {cell.errors} requests failed")
                cells[name].append(
                    {
                        "rps": cell.rps,
                        "p50_ms": cell.p50_ms,
                        "cpu_ms": sum(after[k] - before[k] for k in before) * 1000 / cell.requests,
                        "round_trips": (proxy.sent() - sent) / cell.requests if proxy else 0.0,
                    }
                )
            pairs = list(zip(cells["A"], cells["B"], strict=True))
            out["clients"][clients] = {
                "throughput": [a["rps"] / b["rps"] - 1 for a, b in pairs],
                "latency": [b["p50_ms"] / a["p50_ms"] - 1 for a, b in pairs],
                "cpu": [b["cpu_ms"] / a["cpu_ms"] - 1 for a, b in pairs],
                "round_trips": {
                    k: statistics.median(c["round_trips"] for c in cells[k]) for k in "AB"
                },
                "rounds": cells,
            }
    finally:
        for server in servers.values():
            server.stop()
            server.log.unlink(missing_ok=True)
    return out


def run_once(url: str, token: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every mechanism once, on a database behind the proxy if asked."""
    with contextlib.ExitStack() as stack:
        proxy = None
        if args.db_latency_ms is not None:
            proxy, url = behind_proxy(stack, url, args.db_latency_ms)
        env = app_env(url, args)
        results = []
        for mechanism in args.mechanisms:
            results.append(measure_pair(env, token, mechanism, args, proxy))
            print("    " + line(results[-1]), flush=True)
        return results


def _pct(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 100:+.1f}% "
        f"({min(values) * 100:+.1f}..{max(values) * 100:+.1f})"
    )


def line(result: dict[str, Any]) -> str:
    parts = [f"{result['mechanism']:<24}"]
    for clients, r in result["clients"].items():
        trips = r["round_trips"]
        parts.append(
            f"{clients}c: throughput {_pct(r['throughput'])} latency {_pct(r['latency'])} "
            f"cpu {_pct(r['cpu'])}"
            + (f" round trips {trips['A']:.2f} vs {trips['B']:.2f}" if trips["A"] else "")
        )
    return "  ".join(parts)


def markdown(runs: list[list[dict[str, Any]]], clients: list[int]) -> str:
    """One row per mechanism and client count: the median gains of each run."""
    lines = [
        "| mechanism | clients | throughput gain, per run | p50 latency gain | CPU gain "
        "| round trips A / B |",
        "| --- | ---: | --- | --- | --- | --- |",
    ]
    for index, first in enumerate(runs[0]):
        for c in clients:
            per = [run[index]["clients"][c] for run in runs]
            trips = per[0]["round_trips"]
            lines.append(
                f"| {first['mechanism']} | {c} "
                + "".join(
                    "| " + ", ".join(f"{statistics.median(p[k]) * 100:+.1f}%" for p in per) + " "
                    for k in ("throughput", "latency", "cpu")
                )
                + (f"| {trips['A']:.2f} / {trips['B']:.2f} |" if trips["A"] else "| |")
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(parser)
    parser.set_defaults(workers=None, conn_max_age=600)  # conn_max_age: leasebroker's
    parser.add_argument(
        "--app",
        choices=APPS,
        default="minimal",
        help="minimal: benchmarks/minimal_app (gthread, 2 workers); leasebroker: the "
        "example project's create, POST /v1/workers (sync, 4 workers), as http_bench.py runs it",
    )
    parser.add_argument(
        "--mechanisms",
        default=",".join(MECHANISMS),
        help="comma-separated, of " + ", ".join(MECHANISMS),
    )
    parser.add_argument("--requests", type=int, default=300, help="requests per round")
    parser.add_argument("--warmup", type=int, default=60, help="requests per server to warm up")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of A and of B")
    parser.add_argument("--runs", type=int, default=3, help="runs over every mechanism")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.workers is None:
        args.workers = 2 if args.app == "minimal" else 4
    args.mechanisms = [m for m in args.mechanisms.split(",") if m]
    unknown = set(args.mechanisms) - set(MECHANISMS)
    if unknown:
        parser.error(f"unknown mechanisms: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"mechanisms, {args.app}: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{args.requests} requests x {args.rounds} rounds each of A and B, {args.runs} runs, "
        f"db latency {args.db_latency_ms if args.db_latency_ms is not None else 'loopback'} ms, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    db = ThrowawayDatabase(args.database_url)
    runs: list[list[dict[str, Any]]] = []
    try:
        db.create()
        try:
            with tempfile.TemporaryDirectory(prefix="mechanisms-") as var:
                args.var = Path(var)
                token = prepare_app(db.url, args)
                for number in range(args.runs):
                    print(f"  run {number + 1} (load average {os.getloadavg()[0]:.2f})")
                    runs.append(run_once(db.url, token, args))
        finally:
            db.drop()
    except SetupError as exc:
        print(f"BENCHMARK FAILED: {exc}")
        return 2
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other work skews the numbers)")
    print(markdown(runs, args.clients))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
