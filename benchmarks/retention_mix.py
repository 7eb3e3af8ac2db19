"""A week of mixed traffic: rows the sweeper keeps against rows still inside their window.

Not a test: a measurement (docs/retention.md shows the results). Every simulated hour,
``--per-hour`` keys of each of three views (1 h, 24 h and 7 day windows) are claimed and
completed, then the sweeper runs; the clock is moved with ``testing.travel`` (no
waiting). At the end of each simulated day it prints the rows stored, the rows still
inside their window, and what a sweeper keeping every day for ``MAX_RETENTION`` (7 days,
by creation day: the longest window deciding for every view) would have stored::

    createdb -h 127.0.0.1 -U postgres idempotency_bench   # a scratch database
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/idempotency_bench \\
        python benchmarks/retention_mix.py --days 9 --per-hour 20
    python benchmarks/retention_mix.py --days 9 --per-hour 20   # SQLite, a temporary file

``--plain`` keeps PostgreSQL's plain table (batched deletes instead of dropped days).
The database's contents are replaced: use a scratch database.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
import environ
from django.conf import settings

HOUR, DAY = 3600.0, 86400.0
VIEWS = {"1 h": HOUR, "24 h": DAY, "7 d": 7 * DAY}
MAX_RETENTION = 7 * DAY


def configure(plain: bool) -> None:
    env = environ.Env()
    default = f"sqlite:///{tempfile.mkdtemp()}/mix.sqlite3"
    settings.configure(
        DATABASES={"default": env.db("DATABASE_URL", default=default)},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
        USE_TZ=True,
        IDEMPOTENCY={
            "OUTBOX_KICK": False,
            "MAX_RETENTION": MAX_RETENTION,
            "PARTITION_RECORDS": not plain,
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=9, help="simulated days")
    parser.add_argument("--per-hour", type=int, default=20, help="keys per view per hour")
    parser.add_argument("--plain", action="store_true", help="PostgreSQL: the plain table")
    args = parser.parse_args()
    configure(args.plain)

    from django.core.management import call_command
    from django.db import connection, transaction

    from django_idempotency import retention, store, testing
    from django_idempotency.models import IdempotencyRecord
    from django_idempotency.store import clock
    from django_idempotency.store.catalog import forget

    call_command("migrate", "django_idempotency", "zero", verbosity=0)
    call_command("migrate", verbosity=0)
    forget()
    claimed_at: list[float] = []  # offsets of every claim, for the old design's count
    print(f"database: {connection.vendor}, table: {retention.sweep(dry_run=True).method}")
    print()
    print("| day | rows stored | inside their window | stored / inside | old design stored |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for hour in range(args.days * 24):
        offset = hour * HOUR
        with testing.travel(offset):
            for window in VIEWS.values():
                for _ in range(args.per_hour):
                    sc = store.Scope("auth.user:1", f"POST /w{window:g}", str(uuid.uuid4()))
                    won = store.claim(sc, "f" * 64, lease=60, retention=window)
                    assert isinstance(won, store.Claim)
                    with transaction.atomic():
                        store.complete(won, store.StoredResponse(201, [], b"{}"))
                    claimed_at.append(offset)
            retention.sweep()
            if hour % 24 == 23:
                now = clock.store_now(connection)
                stored = IdempotencyRecord.objects.count()
                inside = IdempotencyRecord.objects.filter(expires_at__gt=now).count()
                # By creation day: whole days kept until MAX_RETENTION ago.
                base = now.timestamp() - offset  # real time of offset 0
                cutoff_day = math.floor((now.timestamp() - MAX_RETENTION) / DAY)
                old = sum(1 for at in claimed_at if math.floor((base + at) / DAY) >= cutoff_day)
                ratio = stored / inside if inside else float("nan")
                print(f"| {hour // 24 + 1} | {stored} | {inside} | {ratio:.2f} | {old} |")


if __name__ == "__main__":
    main()
