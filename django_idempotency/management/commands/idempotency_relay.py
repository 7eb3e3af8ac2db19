"""``manage.py idempotency_relay``: deliver outbox messages without Celery (docs/outbox.md).

The loop outlives the database: an outage (``management.jobs``) is logged
once when it starts and once when it ends, the relay retries with backoff and goes
on. ``SIGTERM`` (``kill``, a container stop) is a graceful stop: the handlers running
finish, what was delivered is marked, the rest of the batch is handed back, and the
command exits 0; a second ``SIGTERM`` stops it at once, as Ctrl-C does.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.translation import ngettext

from django_idempotency.conf import conf
from django_idempotency.management.jobs import UNAVAILABLE, GracefulStop, Outage
from django_idempotency.outbox import relay
from django_idempotency.store.routing import all_databases

logger = logging.getLogger("django_idempotency.outbox")


class Command(BaseCommand):
    """Run the outbox relay: once (``--once``) or in a loop (the default)."""

    help = (
        "Deliver due outbox messages. With --once, deliver everything due now and exit; "
        "otherwise poll every --interval seconds until stopped (SIGTERM, Ctrl-C) or "
        "--max-iterations, riding out database outages with backoff."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument(
            "--once", action="store_true", help="Deliver what is due now, then exit."
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=1.0,
            help="Seconds to wait after a pass that found nothing more to do (default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="Messages claimed per batch (default: the OUTBOX_BATCH_SIZE setting).",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="Handlers run at the same time, in a thread pool (default: the "
            "OUTBOX_RELAY_THREADS setting, 1).",
        )
        parser.add_argument(
            "--max-iterations",
            type=int,
            default=None,
            help="Stop after this many batches (default: run until interrupted).",
        )
        parser.add_argument(
            "--database",
            default=None,
            choices=tuple(connections),
            help="Database alias (default: each alias of the IDEMPOTENCY DATABASES "
            "setting, else the router's choice).",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        batch_size = options["batch_size"]
        if batch_size is None:
            batch_size = conf.outbox_batch_size
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        if options["interval"] < 0:
            raise CommandError("--interval must be 0 or more seconds.")
        threads = options["threads"]
        if threads is not None and threads < 1:
            raise CommandError("--threads must be at least 1.")
        limit = options["max_iterations"]
        if limit is not None and limit < 1:
            raise CommandError("--max-iterations must be at least 1.")
        aliases = (options["database"],) if options["database"] else all_databases()
        once = options["once"]
        # One relay per database for the whole run: a batch's marks are written while
        # the next batch is claimed (docs/outbox.md, "Marks").
        relays = {alias: relay.Relay(alias, threads=threads) for alias in aliases}
        outages = {alias: Outage("outbox relay", alias, logger) for alias in aliases}
        unavailable: dict[str, BaseException] = {}  # --once: databases given up on
        stop = GracefulStop(*(each.stop for each in relays.values()))
        iterations = 0
        try:
            with stop:
                while not stop.requested and (limit is None or iterations < limit):
                    now = time.monotonic()
                    ready = [
                        alias
                        for alias in relays
                        if alias not in unavailable and outages[alias].retry_at <= now
                    ]
                    if not ready:
                        if len(unavailable) == len(relays):
                            break
                        stop.sleep(min(o.retry_at for o in outages.values() if o.down) - now)
                        continue
                    ran = full = False
                    for alias in ready:
                        try:
                            handled = relays[alias].deliver_batch(batch_size)
                        except UNAVAILABLE as exc:
                            if once:
                                unavailable[alias] = exc
                            else:
                                outages[alias].failed(exc)
                            continue
                        outages[alias].recovered()
                        ran = True
                        full = full or handled >= batch_size
                    if ran:
                        iterations += 1
                    if full or stop.requested:
                        continue  # batches back to back while they come back full
                    if once or (limit is not None and iterations >= limit):
                        break
                    # Drained for now: nothing left pending while it sleeps.
                    for alias, each in relays.items():
                        if not outages[alias].down:
                            try:
                                each.close()
                            except UNAVAILABLE as exc:
                                outages[alias].failed(exc)
                    pause = options["interval"]
                    down = [o for o in outages.values() if o.down]
                    if down:
                        pause = min(pause, min(o.retry_at for o in down) - time.monotonic())
                    stop.sleep(pause)  # poll interval or backoff, not synchronisation
        except KeyboardInterrupt:
            pass
        finally:
            unmarked = self._close(relays)
        if stop.requested:
            logger.info("outbox relay stopped on SIGTERM")
        total = sum(each.handled for each in relays.values())
        self.stdout.write(
            ngettext(
                "Handled %(count)d outbox message.", "Handled %(count)d outbox messages.", total
            )
            % {"count": total}
        )
        if total:
            self.stdout.write(outcome_line(relays.values()))
        problems = [f"database {alias!r} unavailable: {exc}" for alias, exc in unavailable.items()]
        problems += [
            f"database {alias!r}: {count} delivered message(s) not marked sent, delivered "
            f"again after the relay lease: {exc}"
            for alias, (count, exc) in unmarked.items()
        ]
        if problems:
            raise CommandError("; ".join(problems))

    def _close(self, relays: dict[str, relay.Relay]) -> dict[str, tuple[int, BaseException]]:
        """Close every relay (its last marks); the marks the database refused, by alias."""
        unmarked: dict[str, tuple[int, BaseException]] = {}
        for alias, each in relays.items():
            try:
                each.close()
            except UNAVAILABLE as exc:
                unmarked[alias] = (each.unmarked, exc)
        return unmarked


def outcome_line(relays: Iterable[relay.Relay]) -> str:
    """What became of the messages the relays handled, by outcome, for the command's output.

    ``"2 delivered, 1 failed (retried later), 0 dead-lettered."``, with a fourth count for
    failures another relay's claim had taken over, when there were any.
    """
    outcomes: collections.Counter[str] = collections.Counter()
    for each in relays:
        outcomes.update(each.outcomes)
    line = (
        f"{outcomes['delivered']} delivered, {outcomes['failed']} failed (retried later), "
        f"{outcomes['dead']} dead-lettered"
    )
    if outcomes["taken over"]:
        line += f", {outcomes['taken over']} failed after another relay took them over"
    return line + "."
