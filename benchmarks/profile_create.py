"""Where a keyed create spends its time on the server (pyinstrument), without HTTP.

Not a test: a measurement behind docs/benchmarks.md. It runs the leasebroker example
in-process (Django's test ``Client``, no network, no gunicorn) on a throwaway
PostgreSQL database (or SQLite with ``--sqlite``), sends ``--requests`` creates of
each kind (unkeyed in one transaction, keyed first execution, replay), prints the
mean server time of each and the median CPU time of the thread that serves it (client
and server share it: the test client's part is the same for every kind), and
profiles the keyed ones with pyinstrument, attributing the time to the steps of the
protocol (``protocol.begin`` and its parts, the view, ``store.complete``, the
commits). Usage::

    pip install pyinstrument
    python benchmarks/profile_create.py                 # PostgreSQL, 300 requests
    python benchmarks/profile_create.py --html /tmp/keyed.html
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "example_project"))
sys.path.insert(0, str(ROOT))

from storm.server import ThrowawayDatabase  # noqa: E402

BODY = {"image": "bench", "cpu": 1, "memory_gb": 1, "labels": {"bench": "profile"}}
#: (label, function, file suffix): the steps the profile is broken into.
STEPS = [
    ("the whole idempotent path (handle.run)", "run", "django_idempotency/protocol/handle.py"),
    ("  protocol.begin: key, principal, fingerprint, claim", "begin", "protocol/begin.py"),
    ("    fingerprint.take", "take", "protocol/fingerprint.py"),
    ("    store.claim (the claim statement)", "claim", "store/claims.py"),
    ("  the view itself (WorkerViewSet.create)", "create", "workers/views.py"),
    ("  DRF finalize_response (render JSON)", "finalize", "protocol/handle.py"),
    ("  responses.snapshot", "snapshot", "protocol/responses.py"),
    ("  store.complete (fenced UPDATE)", "complete", "store/settle.py"),
    ("  COMMIT of the view's block (Atomic.__exit__)", "__exit__", "django/db/transaction.py"),
    ("DRF authentication (token lookup)", "perform_authentication", "rest_framework/views.py"),
    ("database round trips (psycopg execute)", "execute", "psycopg/cursor.py"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--html", type=Path, help="also write pyinstrument's HTML report")
    return parser.parse_args()


def setup(url: str, atomic: bool) -> Any:
    os.environ["DJANGO_SETTINGS_MODULE"] = "leasebroker.settings"
    os.environ["DATABASE_URL"] = url + ("?atomic_requests=true" if atomic else "")
    os.environ["DEBUG"] = "false"
    os.environ["ALLOWED_HOSTS"] = "testserver"
    os.environ["LEASEBROKER_IDEMPOTENCY_REQUIRED"] = "false"
    import django
    from django.core.management import call_command
    from django.test import Client

    django.setup()
    call_command("migrate", verbosity=0)
    call_command("create_demo_principals", stdout=open(os.devnull, "w"))  # noqa: SIM115
    from workers.demo_principals import DEMO_TOKENS

    return Client(HTTP_AUTHORIZATION=f"Token {DEMO_TOKENS['alice']}")


def timed(send: Callable[[], Any], n: int, cpu: list[float] | None = None) -> list[float]:
    """Seconds of each of ``n`` requests; with ``cpu``, also this thread's CPU seconds."""
    times = []
    for _ in range(n):
        started, used = time.perf_counter(), time.thread_time()
        response = send()
        times.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.thread_time() - used)
        assert response.status_code == 201, response.content
    return times


def frames(frame: Any) -> Iterator[Any]:
    yield frame
    for child in frame.children:
        yield from frames(child)


def attribute(root: Any) -> dict[str, float]:
    """Seconds spent under each step (outermost matching frames only)."""
    totals: dict[str, float] = {}
    for label, function, suffix in STEPS:

        def walk(frame: Any, label: str = label, fn: str = function, sf: str = suffix) -> float:
            if frame.function == fn and (frame.file_path or "").endswith(sf):
                return float(frame.time)
            return sum(walk(child) for child in frame.children)

        totals[label] = walk(root)
    return totals


def main() -> int:
    args = parse_args()
    from pyinstrument import Profiler

    db = None
    if args.sqlite:
        tmp = tempfile.mkdtemp(prefix="profile-create-")
        url = f"sqlite:///{tmp}/profile.sqlite3"
    else:
        db = ThrowawayDatabase(args.database_url)
        db.create()
        url = db.url
    try:
        client = setup(url, atomic=True)
        from django.db import connection

        def unkeyed() -> Any:
            return client.post("/v1/workers", BODY, content_type="application/json")

        def keyed() -> Any:
            return client.post(
                "/v1/workers",
                BODY,
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
            )

        replay_key = str(uuid.uuid4())

        def replay() -> Any:
            return client.post(
                "/v1/workers",
                BODY,
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=replay_key,
            )

        replay()
        for send in (unkeyed, keyed, replay):  # warm up
            timed(send, 30)
        from django.test.utils import CaptureQueriesContext

        print(f"{connection.vendor}: SQL statements per request (BEGIN/COMMIT included):")
        for label, send in (
            ("unkeyed, ATOMIC_REQUESTS", unkeyed),
            ("keyed, first execution", keyed),
            ("keyed, replay", replay),
        ):
            with CaptureQueriesContext(connection) as ctx:
                send()
            kinds = " ".join(q["sql"].split()[0].upper() for q in ctx.captured_queries)
            print(f"  {label:<26} {len(ctx.captured_queries):2d}: {kinds}")
        print(f"{connection.vendor}, {args.requests} requests each, in-process (no HTTP):")
        means = {}
        for label, send in (
            ("unkeyed, ATOMIC_REQUESTS", unkeyed),
            ("keyed, first execution", keyed),
            ("keyed, replay", replay),
        ):
            cpu: list[float] = []
            times = timed(send, args.requests, cpu)
            means[label] = statistics.mean(times) * 1000
            print(
                f"  {label:<26} mean {means[label]:6.2f} ms  median "
                f"{statistics.median(times) * 1000:6.2f} ms  CPU (this thread) median "
                f"{statistics.median(cpu) * 1000:6.2f} ms"
            )
        profiler = Profiler(interval=0.0002)
        profiler.start()
        timed(keyed, args.requests)
        profiler.stop()
        session = profiler.last_session
        root = session.root_frame()
        total = float(root.time)
        print(f"\nkeyed first execution, profiled ({args.requests} requests, {total:.2f} s):")
        for label, seconds in attribute(root).items():
            print(
                f"  {label:<55} {seconds / args.requests * 1000:6.2f} ms  "
                f"{seconds / total * 100:5.1f} %"
            )
        if args.html:
            args.html.write_text(profiler.output_html())
            print(f"\nHTML report: {args.html}")
    finally:
        from django.db import connections

        connections.close_all()
        if db is not None:
            db.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
