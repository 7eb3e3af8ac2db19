"""Retention sweep cost: dropping a day partition vs a batched DELETE, per row count.

Not a test: a measurement (docs/retention.md shows the results). PostgreSQL only::

    createdb -h 127.0.0.1 -U postgres idempotency_bench   # once
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/idempotency_bench \\
        python benchmarks/sweep.py --rows 100000 1000000 --repeat 3 --claims 2000

For each N it loads N expired records into one old day with one ``generate_series``
INSERT, then times ``retention.sweep()``: first on the partitioned table (the day's
partition is dropped), then on the plain table of a project that opted
out of partitioning (``PARTITION_RECORDS = False``; batched DELETE of ``--batch-size``
rows). The sweep also finds a day of live rows (``--live`` of them) that it must keep.
With ``--claims K`` it also times K sequential claims (new keys, then replays) on both
table kinds: the price of the advisory-lock uniqueness on the hot path.

The database's contents are replaced: use a scratch database.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
import environ
from django.conf import settings


def configure(batch_size: int) -> None:
    env = environ.Env()
    settings.configure(
        DATABASES={"default": env.db("DATABASE_URL")},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
        USE_TZ=True,
        IDEMPOTENCY={"OUTBOX_KICK": False, "SWEEP_BATCH_SIZE": batch_size},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


LOAD = """
INSERT INTO django_idempotency_record (
    principal, endpoint, key, fingerprint, state, owner_token, lease_until,
    recovery_point, response_status, response_headers, response_body, created_at,
    completed_at, expires_at, sweep_after)
SELECT 'auth.user:' || (n %% 1000), 'POST /v1/workers', %(prefix)s || n, repeat('f', 64),
       'completed', gen_random_uuid(), t, '', 201,
       '[["Content-Type", "application/json"]]'::jsonb,
       convert_to('{"id": ' || n || ', "name": "worker-' || n || '"}', 'UTF8'),
       t, t, t + interval '1 day', t
FROM generate_series(1, %(rows)s) AS n,
     LATERAL (SELECT %(day)s::timestamptz + (n %% 86000) * interval '1 second') AS s(t)
"""


def load(rows: int, day: dt.datetime) -> float:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        # Bulk load: skip the scope trigger (keys are unique by construction).
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(LOAD, {"rows": rows, "day": day, "prefix": f"{uuid.uuid4()}-"})
        cursor.execute("SET session_replication_role = DEFAULT")
    return time.perf_counter() - started


def use_table(partitioned: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    from django_idempotency.store.catalog import forget

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_idempotency_record")
    from django.test import override_settings

    call_command("migrate", "django_idempotency", "zero", verbosity=0)
    with override_settings(IDEMPOTENCY={**settings.IDEMPOTENCY, "PARTITION_RECORDS": partitioned}):
        call_command("migrate", "django_idempotency", verbosity=0)
    forget()


def wal_position() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        return str(cursor.fetchone()[0])


def wal_since(start: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start])
        return int(cursor.fetchone()[0])


def settle() -> None:
    """Vacuum, analyze and checkpoint, so background work does not pollute a timing."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) django_idempotency_record")
        cursor.execute("CHECKPOINT")


def measure(rows: int, live: int, partitioned: bool) -> dict[str, float]:
    from django.db import connection

    from django_idempotency import retention
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.retention import partitions, sweeper
    from django_idempotency.store import clock

    use_table(partitioned)
    now = clock.store_now(connection)
    old_day = sweeper.start_of_day(now) - dt.timedelta(days=10)
    if partitioned:
        partitions.ensure(connection, old_day.date())
        partitions.ensure(connection, now.date())
    loaded = load(rows, old_day)
    load(live, now.replace(hour=0, minute=0, second=0, microsecond=0))
    settle()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('django_idempotency_record')")
        size = 0 if partitioned else cursor.fetchone()[0]
        if partitioned:
            name = partitions.partition_name(old_day.date())
            cursor.execute("SELECT pg_total_relation_size(%s)", [name])
            size = cursor.fetchone()[0]
    wal = wal_position()
    started = time.perf_counter()
    report = retention.sweep()
    seconds = time.perf_counter() - started
    wal_bytes = wal_since(wal)
    vacuum = 0.0
    if not partitioned:  # the dead rows' space comes back only after a VACUUM
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM django_idempotency_record")
        vacuum = time.perf_counter() - started
    left = IdempotencyRecord.objects.count()
    expected = "partitions" if partitioned else "delete"
    if left != live or report.errors or report.method != expected:
        raise SystemExit(f"sweep left {left} rows (expected {live}); errors {report.errors}")
    return {"load": loaded, "sweep": seconds, "wal": wal_bytes, "vacuum": vacuum, "size": size}


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def time_claims(count: int) -> tuple[float, float]:
    from django_idempotency import store

    def one(sc: store.Scope) -> float:
        started = time.perf_counter()
        store.claim(sc, "a" * 64, lease=60, retention=86400)
        return time.perf_counter() - started

    scopes = [store.Scope("auth.user:1", "POST /w", str(uuid.uuid4())) for _ in range(count)]
    first = [one(sc) for sc in scopes]
    replays = [one(sc) for sc in scopes]  # in flight (409) answers: same round trip
    return statistics.median(first) * 1e6, statistics.median(replays) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per N; medians shown")
    args = parser.parse_args()
    configure(args.batch_size)

    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("Set DATABASE_URL to a PostgreSQL scratch database.")
    call_command("migrate", verbosity=0)
    print(
        f"PostgreSQL {connection.pg_version}, Python {platform.python_version()}, "
        f"{platform.machine()}; batch size {args.batch_size}, {args.live} live rows kept\n"
    )
    print(
        "| expired rows | day's size (MB) | drop partition (s) | WAL (kB) "
        "| batched delete (s) | WAL (kB) | + VACUUM (s) | delete / drop |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rows in args.rows:
        drop = median([measure(rows, args.live, partitioned=True) for _ in range(args.repeat)])
        delete = median([measure(rows, args.live, partitioned=False) for _ in range(args.repeat)])
        ratio = f"{delete['sweep'] / drop['sweep']:,.0f}x" if rows else "-"
        print(
            f"| {rows:,} | {drop['size'] / 2**20:,.0f} | {drop['sweep']:.3f} "
            f"| {drop['wal'] / 1024:,.0f} | {delete['sweep']:.2f} | {delete['wal'] / 1024:,.0f} "
            f"| {delete['vacuum']:.2f} | {ratio} |",
            flush=True,
        )
    if args.claims:
        print("\n| table | claim, new key (median µs) | claim, replay (median µs) |")
        print("| --- | ---: | ---: |")
        for partitioned in (True, False):
            use_table(partitioned)
            new, replay = time_claims(args.claims)
            kind = "partitioned" if partitioned else "plain"
            print(f"| {kind} | {new:.0f} | {replay:.0f} |", flush=True)
    use_table(True)


if __name__ == "__main__":
    main()
