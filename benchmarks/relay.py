"""Outbox relay throughput: messages/s per batch size, handler threads and relay processes.

Not a test: a measurement. Run against PostgreSQL (the reference target)::

    createdb -h 127.0.0.1 -U postgres idempotency_bench   # once
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/idempotency_bench \\
        python benchmarks/relay.py --messages 10000 --batch-sizes 1 100 1000 --repeat 3

It migrates the database, then for each combination of batch size, handler threads
(``--threads``) and relay processes (``--processes``), and each run, inserts
``--messages`` pending messages, vacuums the table, runs the relay until none is due
and prints a Markdown table of messages per second (median, min and max of the runs).

- Without ``--processes`` one relay runs in this process, a ``relay.Relay`` calling
  ``deliver_batch`` in a loop, as the ``idempotency_relay`` command does.
- With ``--processes N ...`` each run starts N relay processes (this script with
  ``--child``), waits until every one is ready, starts them at once and times until
  the last one found nothing due. After each run it checks that every message is
  ``sent`` at its first attempt (none claimed twice) and that the deliveries the
  processes counted add up to the messages: a "dup" column counts violations.
- ``--handler noop`` (the default) does nothing; ``--handler http`` POSTs each
  message, its dedup key as ``Idempotency-Key``, to a local HTTP server that this
  script starts in a process of its own and that answers after ``--http-delay``
  seconds (default 0.02): an I/O-bound handler, for ``--threads``.

``--mark-delays 0 0.005`` compares ``OUTBOX_MARK_DELAY`` values: ``0`` writes each mark
before the next handler starts (one commit per message), the default groups them.
``--db-latency-ms 0.5`` puts the relays' connections behind ``latency_proxy.py`` (a
1 ms round trip to PostgreSQL). The combinations are interleaved within each repeat.

SQLite works too (for comparison; leave DATABASE_URL unset to use a temporary file),
in one process only.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import django
import environ
from django.conf import settings

SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

delay = float(sys.argv[1])


class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per relay thread

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(delay)  # the downstream service's latency
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer.request_queue_size = 256
server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def configure() -> None:
    env = environ.Env()
    default = f"sqlite:///{tempfile.gettempdir()}/idempotency_bench.sqlite3"
    settings.configure(
        DATABASES={"default": env.db("DATABASE_URL", default=default)},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
        USE_TZ=True,
        IDEMPOTENCY={"OUTBOX_KICK": False},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def register(handler: str, port: int | None) -> None:
    """Register the handler of ``bench.topic``: a no-op, or a POST to the local server."""
    import http.client

    from django_idempotency import outbox

    if handler == "noop":
        outbox.register("bench.topic")(lambda message, dedup_key: None)
        return
    local = threading.local()

    def post(message: Any, dedup_key: str) -> None:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection("127.0.0.1", port)
        body = json.dumps(message.payload).encode()
        connection.request("POST", "/deliver", body, {"Idempotency-Key": dedup_key})
        response = connection.getresponse()
        response.read()
        if response.status != 204:
            raise RuntimeError(f"downstream answered {response.status}")

    outbox.register("bench.topic")(post)


def fill(messages: int) -> None:
    from django.db import connection

    from django_idempotency.models import OutboxMessage

    OutboxMessage.objects.all().delete()
    OutboxMessage.objects.bulk_create(
        (
            OutboxMessage(topic="bench.topic", payload={"n": n}, dedup_key=f"bench-{n}")
            for n in range(messages)
        ),
        batch_size=5000,
    )
    if connection.vendor == "postgresql":  # a fresh queue: no dead tuples from before
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE django_idempotency_outbox")


def drain(
    batch_size: int, threads: int, max_seconds: float, mark_delay: float | None = None
) -> int:
    """One relay until nothing is due (or ``max_seconds``); returns messages handled.

    ``mark_delay``: ``OUTBOX_MARK_DELAY`` for this run (``None``: the setting's default;
    ``0``: each mark written before the next handler starts, one commit per message).
    """
    from django.test.utils import override_settings

    from django_idempotency.outbox import relay

    if mark_delay is not None:
        marks = {**settings.IDEMPOTENCY, "OUTBOX_MARK_DELAY": mark_delay}
        with override_settings(IDEMPOTENCY=marks):
            return drain(batch_size, threads, max_seconds)

    delivered = 0
    started = time.perf_counter()
    with relay.Relay(threads=threads) as one:  # as the idempotency_relay command runs it
        while time.perf_counter() - started < max_seconds:
            handled = one.deliver_batch(batch_size)
            if not handled:
                break
            delivered += handled
    return delivered


#: The SQL floor: each batch of due messages locked, marked ``sent`` and returned in one
#: autocommitted statement, nothing else. The least any relay on this table can cost,
#: and at most once (a crash after it loses the batch: no lease, no mark after the
#: handler), so not a relay: a yardstick for the relay's own statements and Python.
FLOOR_SQL = """
WITH due AS (
    SELECT id FROM django_idempotency_outbox
    WHERE state = 'pending' AND available_at <= statement_timestamp()
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE django_idempotency_outbox AS m
SET state = 'sent', sent_at = statement_timestamp(), attempts = m.attempts + 1
WHERE m.id = ANY(ARRAY(SELECT id FROM due))
RETURNING m.id, m.topic, m.payload, m.dedup_key, m.attempts
"""


def run_floor(batch_size: int, messages: int, max_seconds: float) -> float:
    """The SQL floor (:data:`FLOOR_SQL`) on the same table and rows; messages/s."""
    from django.db import connection

    fill(messages)
    delivered = 0
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while time.perf_counter() - started < max_seconds:
            cursor.execute(FLOOR_SQL, {"limit": batch_size})
            rows = cursor.fetchall()
            if not rows:
                break
            delivered += len(rows)
    return delivered / (time.perf_counter() - started)


def run_statements(batch_size: int, messages: int, max_seconds: float) -> float:
    """The relay's own two statements per batch, with the least Python; messages/s.

    The claim (``store.outbox.postgresql``'s statement: lock, count the attempt, lease)
    and the mark (its fenced ``UPDATE``), one after the other on one connection,
    each committed, with no handler, no message objects and no lease keeper: what the
    relay's SQL costs apart from its Python, beside the floor.
    """
    from django.db import connection

    from django_idempotency.conf import conf
    from django_idempotency.store.outbox import postgresql

    fill(messages)
    now = "(statement_timestamp() + %(offset)s * interval '1 second')"
    claim_sql = postgresql._CLAIM_SQL.format(now=now)
    mark_sql = postgresql._MARK_SQL.format(now=now)
    claim_params = {
        "offset": 0.0, "limit": batch_size, "lease": 30.0,
        "max": conf.outbox_max_attempts, "abandoned": " abandoned",
    }  # fmt: skip
    delivered = 0
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while time.perf_counter() - started < max_seconds:
            cursor.execute(claim_sql, claim_params)
            rows = cursor.fetchall()
            if not rows:
                break
            until = [row[5].isoformat() + "+00:00" for row in rows]  # naive UTC
            ids = [row[0] for row in rows]
            attempts = [row[4] for row in rows]
            marked = {"offset": 0.0, "ids": ids, "attempts": attempts, "until": until}
            cursor.execute(mark_sql, marked)
            if len(cursor.fetchall()) != len(rows):
                raise RuntimeError("a mark's fence did not match its claim")
            delivered += len(rows)
    return delivered / (time.perf_counter() - started)


def run_here(
    batch_size: int, threads: int, messages: int, max_seconds: float, mark_delay: float | None
) -> float:
    fill(messages)
    started = time.perf_counter()
    delivered = drain(batch_size, threads, max_seconds, mark_delay)
    return delivered / (time.perf_counter() - started)


def run_processes(
    args: argparse.Namespace,
    batch_size: int,
    threads: int,
    processes: int,
    port: int | None,
    mark_delay: float | None,
) -> tuple[float, int]:
    """Start ``processes`` relays at once; returns (messages/s, violations)."""
    from django_idempotency.models import OutboxMessage, OutboxState

    fill(args.messages)
    command = [sys.executable, __file__, "--child", "--batch-sizes", str(batch_size),
               "--threads", str(threads), "--handler", args.handler,
               "--max-seconds", str(args.max_seconds)]  # fmt: skip
    if port is not None:
        command += ["--port", str(port)]
    if mark_delay is not None:
        command += ["--mark-delays", str(mark_delay)]
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        started = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        counts = [int(child.stdout.readline()) for child in children if child.stdout]
        elapsed = time.perf_counter() - started
        for child in children:
            child.wait(60)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    sent_once = OutboxMessage.objects.filter(state=OutboxState.SENT, attempts=1).count()
    violations = abs(sum(counts) - args.messages) + (args.messages - sent_once)
    return sum(counts) / elapsed, violations


def child(args: argparse.Namespace) -> None:
    """A relay process of ``--processes``: ready, wait for the start line, drain."""
    configure()
    register(args.handler, args.port)
    from django.db import connection

    connection.ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()
    delay = args.mark_delays[0] if args.mark_delays else None
    print(drain(args.batch_sizes[0], args.threads[0], args.max_seconds, delay), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per combination (median)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1], help="handler threads per relay"
    )
    parser.add_argument(
        "--processes", type=int, nargs="+", default=None, help="relay processes (separate)"
    )
    parser.add_argument("--handler", choices=["noop", "http"], default="noop")
    parser.add_argument("--http-delay", type=float, default=0.02, help="seconds per request")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="stop a run after this long and report what was delivered",
    )
    parser.add_argument(
        "--mark-delays",
        type=float,
        nargs="+",
        default=None,
        help="OUTBOX_MARK_DELAY values to compare (0: one commit per message)",
    )
    parser.add_argument(
        "--db-latency-ms",
        type=float,
        default=None,
        help="the relays' database connections behind benchmarks/latency_proxy.py, this "
        "many ms each way (0.5: a 1 ms round trip)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with contextlib.ExitStack() as stack:
        if args.db_latency_ms is not None:
            behind_the_proxy(stack, args.db_latency_ms)
        compare(args)


def behind_the_proxy(stack: contextlib.ExitStack[Any], delay_ms: float) -> None:
    """Point ``DATABASE_URL`` (this process's and its children's) through a latency proxy."""
    from latency_proxy import behind_proxy

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        raise SystemExit("--db-latency-ms needs DATABASE_URL=postgres://...")
    _proxy, os.environ["DATABASE_URL"] = behind_proxy(stack, url, delay_ms)


def of_floor(rates: list[float], floor: list[float] | None) -> str:
    """Each run's rate over the floor's in the same repeat: median (min-max)."""
    if not floor:
        return "-"
    ratios = sorted(rate / base for rate, base in zip(rates, floor, strict=True))
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def compare(args: argparse.Namespace) -> None:
    """Every combination, ``--repeat`` times, the combinations interleaved in each."""
    configure()

    from django.core.management import call_command
    from django.db import connection

    from django_idempotency import outbox
    from django_idempotency.models import OutboxMessage

    call_command("migrate", verbosity=0)
    server = None
    port = None
    if args.handler == "http":
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(args.http_delay)], stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None
        port = int(server.stdout.readline())
    register(args.handler, port)

    vendor = connection.vendor
    if vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            vendor += " " + cursor.fetchone()[0]
    handler = "no-op handler" if args.handler == "noop" else (
        f"HTTP handler ({args.http_delay * 1000:.0f} ms per request, local server)"
    )  # fmt: skip
    load = os.getloadavg()
    print(
        f"{vendor}, Python {platform.python_version()}, Django {django.get_version()}, "
        f"{args.messages} messages per run, {args.repeat} runs each, {handler}, "
        f"{os.cpu_count()} CPUs, load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    processes = args.processes or [None]
    combinations = list(
        itertools.product(args.batch_sizes, args.threads, processes, args.mark_delays or [None])
    )
    rates: dict[tuple[Any, ...], list[float]] = {c: [] for c in combinations}
    violations = dict.fromkeys(combinations, 0)
    # The SQL floor beside each batch size, in the same repeats (PostgreSQL, no-op
    # handler: the floor runs no handler).
    with_floor = connection.vendor == "postgresql" and args.handler == "noop"
    floors: dict[int, list[float]] = {size: [] for size in args.batch_sizes} if with_floor else {}
    statements: dict[int, list[float]] = {size: [] for size in floors}
    try:
        for _ in range(args.repeat):
            for combination in combinations:
                batch_size, threads, count, delay = combination
                if count is None:
                    rate = run_here(batch_size, threads, args.messages, args.max_seconds, delay)
                else:
                    rate, wrong = run_processes(args, batch_size, threads, count, port, delay)
                    violations[combination] += wrong
                rates[combination].append(rate)
            for size, runs in floors.items():
                runs.append(run_floor(size, args.messages, args.max_seconds))
                statements[size].append(run_statements(size, args.messages, args.max_seconds))
        print(
            "| batch size | threads | relays | mark delay | messages/s (median) | min | max "
            "| / SQL floor (median, min-max) | dup |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for combination in combinations:
            batch_size, threads, count, delay = combination
            runs = sorted(rates[combination])
            relays = "1 (in process)" if count is None else str(count)
            dup = "-" if count is None else str(violations[combination])
            shown = "default" if delay is None else f"{delay:g} s"
            print(
                f"| {batch_size} | {threads} | {relays} | {shown} "
                f"| {statistics.median(runs):,.0f} | {runs[0]:,.0f} | {runs[-1]:,.0f} "
                f"| {of_floor(rates[combination], floors.get(batch_size))} | {dup} |"
            )
        for size, runs in statements.items():
            ordered = sorted(runs)
            print(
                f"| {size} | - | the relay's statements | - | {statistics.median(ordered):,.0f} "
                f"| {ordered[0]:,.0f} | {ordered[-1]:,.0f} | {of_floor(runs, floors[size])} | - |"
            )
        for size, runs in floors.items():
            runs = sorted(runs)
            print(
                f"| {size} | - | SQL floor | - | {statistics.median(runs):,.0f} "
                f"| {runs[0]:,.0f} | {runs[-1]:,.0f} | 1 | - |"
            )
    finally:
        if server is not None:
            server.kill()
            server.wait()
    load = os.getloadavg()
    print(f"\nload average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    OutboxMessage.objects.all().delete()
    outbox.unregister("bench.topic")


if __name__ == "__main__":
    main()
