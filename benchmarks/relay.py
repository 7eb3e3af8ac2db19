"""Outbox relay throughput: messages/s with a no-op handler, per batch size.

Not a test: a measurement. Run against PostgreSQL (the reference target)::

    createdb -h 127.0.0.1 -U postgres idempotency_bench   # once
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/idempotency_bench \\
        python benchmarks/relay.py --messages 10000 --batch-sizes 1 100 1000 --repeat 3

It migrates the database, then for each batch size and run inserts ``--messages``
pending messages, vacuums the table, runs one relay (``relay.deliver_batch`` in a loop,
as the management command does) until none is due, and prints a Markdown table of
messages per second (median, min and max of the runs). SQLite works too (for comparison;
leave DATABASE_URL unset to use a temporary file).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
import environ
from django.conf import settings


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


def run(batch_size: int, messages: int, max_seconds: float) -> float:
    """Insert ``messages`` due messages, relay them; return messages delivered per second."""
    from django.db import connection

    from django_idempotency import relay
    from django_idempotency.models import OutboxMessage

    OutboxMessage.objects.all().delete()
    OutboxMessage.objects.bulk_create(
        (
            OutboxMessage(topic="bench.noop", payload={"n": n}, dedup_key=f"bench-{n}")
            for n in range(messages)
        ),
        batch_size=5000,
    )
    if connection.vendor == "postgresql":  # a fresh queue: no dead tuples from before
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE django_idempotency_outbox")
    delivered = 0
    started = time.perf_counter()
    with relay.Relay() as one:  # as the idempotency_relay command runs it
        while time.perf_counter() - started < max_seconds:
            handled = one.deliver_batch(batch_size)
            if not handled:
                break
            delivered += handled
    return delivered / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per batch size (median)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="stop a run after this long and report what was delivered",
    )
    args = parser.parse_args()
    configure()

    from django.core.management import call_command
    from django.db import connection

    from django_idempotency import outbox
    from django_idempotency.models import OutboxMessage

    call_command("migrate", verbosity=0)
    outbox.register("bench.noop")(lambda message, dedup_key: None)

    server = connection.vendor
    if server == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server += " " + cursor.fetchone()[0]
    print(
        f"{server}, Python {platform.python_version()}, Django {django.get_version()}, "
        f"{args.messages} messages per run, {args.repeat} runs each, one relay, no-op handler\n"
    )
    print("| batch size | messages/s (median) | min | max |")
    print("| ---: | ---: | ---: | ---: |")
    for batch_size in args.batch_sizes:
        rates = sorted(run(batch_size, args.messages, args.max_seconds) for _ in range(args.repeat))
        median = statistics.median(rates)
        print(f"| {batch_size} | {median:,.0f} | {rates[0]:,.0f} | {rates[-1]:,.0f} |")
    OutboxMessage.objects.all().delete()
    outbox.unregister("bench.noop")


if __name__ == "__main__":
    main()
