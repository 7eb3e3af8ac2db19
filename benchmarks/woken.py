"""How soon a waiting duplicate replays after the original commits (``wait=``).

Not a test: a measurement behind docs/benchmarks.md, "Woken waiters". On a throwaway
PostgreSQL database (loopback), for ``--runs`` keys: an owner thread claims the key and
holds it; a duplicate thread asks for the same key with ``wait=10``; once the duplicate
is waiting, the owner completes and commits; the time from the end of the owner's
COMMIT to the duplicate holding the replay is recorded. Two modes: with owner presence
(the duplicate queues on the owner's presence lock and is woken by the commit) and with
``OWNER_PRESENCE = False`` (the duplicate polls with a growing delay, up to 0.5 s).
Prints the median, 90th percentile and maximum in milliseconds. Usage::

    python benchmarks/woken.py --runs 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "example_project")]

from storm.server import ThrowawayDatabase  # noqa: E402

FP = "b" * 64


def _owner(
    scope: object,
    response: object,
    claimed: threading.Event,
    waiting: threading.Event,
    committed: list[float],
) -> None:
    """Claim, hold until the duplicate waits, complete and commit; note the time."""
    from django.db import connections, transaction

    from django_idempotency import store

    try:
        won = store.claim(scope, FP, lease=30, retention=3600)  # type: ignore[arg-type]
        assert isinstance(won, store.Claim)
        claimed.set()
        assert waiting.wait(30)
        time.sleep(0.05)  # let the duplicate reach its wait (a benchmark, not a test)
        with transaction.atomic():
            store.complete(won, response)  # type: ignore[arg-type]
        committed.append(time.perf_counter())
    finally:
        connections.close_all()


def measure(runs: int, presence_on: bool) -> list[float]:
    """Milliseconds from the owner's COMMIT to the duplicate's replay, per run."""
    from django.test import override_settings

    from django_idempotency import store
    from django_idempotency.protocol import decide, decisions
    from django_idempotency.protocol.options import Options
    from django_idempotency.store import presence

    options = Options.from_kwargs(wait=10)
    response = store.StoredResponse(201, [("Content-Type", "application/json")], b"{}")
    latencies: list[float] = []
    with override_settings(IDEMPOTENCY={"OWNER_PRESENCE": presence_on, "REQUIRED": False}):
        for _ in range(runs):
            scope = store.Scope("bench", "POST /woken", str(uuid.uuid4()))
            claimed = threading.Event()
            waiting = threading.Event()
            committed: list[float] = []

            thread = threading.Thread(
                target=_owner, args=(scope, response, claimed, waiting, committed)
            )
            thread.start()
            assert claimed.wait(30)
            waiting.set()
            decision = decide.decide(scope, FP, options, "default", may_run=True)
            replayed = time.perf_counter()
            thread.join(30)
            assert isinstance(decision, decisions.Respond), decision
            assert decision.response.status_code == 201
            latencies.append((replayed - committed[0]) * 1000)
            assert presence.waiters.count == 0
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    args = parser.parse_args()
    db = ThrowawayDatabase(args.database_url)
    db.create()
    os.environ["DJANGO_SETTINGS_MODULE"] = "minimal_app.settings"
    os.environ["DATABASE_URL"] = db.url
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        print(f"woken: {args.runs} runs per mode, load average {os.getloadavg()[0]:.2f}")
        print("| mode | median ms | p90 ms | max ms |\n| --- | ---: | ---: | ---: |")
        for label, on in (("owner presence (woken)", True), ("presence off (polling)", False)):
            values = sorted(measure(args.runs, on))
            p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
            print(f"| {label} | {statistics.median(values):.1f} | {p90:.1f} | {values[-1]:.1f} |")
        connections.close_all()
    finally:
        db.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
