"""``manage.py idempotency_relay``: deliver outbox messages without Celery (docs/outbox.md).

The loop outlives the database: an outage (``management.jobs``) is logged
once when it starts and once when it ends, the relay retries with backoff and goes
on. ``SIGTERM`` (``kill``, a container stop) is a graceful stop: the handlers running
finish, what was delivered is marked, the rest of the batch is handed back, and the
command exits 0; a second ``SIGTERM`` stops it at once, as Ctrl-C does. On a
schema-per-tenant database (django-tenants) it runs one relay per schema that holds the
outbox, and looks for new schemas each time it has drained them all (docs/tenants.md).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils.translation import ngettext

from django_idempotency.conf import conf
from django_idempotency.management.jobs import UNAVAILABLE, GracefulStop, Outage, OwnConnections
from django_idempotency.outbox import relay
from django_idempotency.store import tenants
from django_idempotency.store.routing import all_databases

logger = logging.getLogger("django_idempotency.outbox")

#: A database alias and a tenant schema (``None``: the connection's own schema).
Target = tuple[str, str | None]


class Command(BaseCommand):
    """Run the outbox relay: once (``--once``) or in a loop (the default)."""

    help = (
        "Deliver due outbox messages. With --once, deliver everything due now and exit; "
        "otherwise poll every --interval seconds until stopped (SIGTERM, Ctrl-C) or "
        "--max-iterations, riding out database outages with backoff. On a django-tenants "
        "database it delivers every tenant schema's outbox."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Relays of tenant schemas dropped during the run: their counts still add up.
        self._dropped: list[relay.Relay] = []

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
        # The connections it opens on the calling thread are closed when it returns,
        # its relays' threads close theirs: a process that lives on keeps no session.
        with OwnConnections():
            self._relay(options)

    def _relay(self, options: dict[str, Any]) -> None:
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
        # One relay per database (and tenant schema) for the whole run: its lease keeper
        # and handler pool are kept from batch to batch (docs/outbox.md, "The relay").
        relays: dict[Target, relay.Relay] = {}
        self._dropped = []
        outages = {alias: Outage("outbox relay", alias, logger) for alias in aliases}
        unavailable: dict[str, BaseException] = {}  # --once: databases given up on

        def stop_relays() -> None:
            for each in list(relays.values()):
                each.stop()

        stop = GracefulStop(stop_relays)
        iterations = 0
        try:
            with stop:
                self._discover(relays, aliases, outages, unavailable, once, threads)
                while not stop.requested and (limit is None or iterations < limit):
                    now = time.monotonic()
                    ready = [
                        target
                        for target in relays
                        if target[0] not in unavailable and outages[target[0]].retry_at <= now
                    ]
                    if not ready:
                        if once or len(unavailable) == len(aliases):
                            break
                        retries = [o.retry_at for o in outages.values() if o.down]
                        stop.sleep((min(retries) if retries else now + options["interval"]) - now)
                        self._discover(relays, aliases, outages, unavailable, once, threads)
                        continue
                    ran = full = False
                    for target in ready:
                        alias = target[0]
                        if alias in unavailable or outages[alias].retry_at > time.monotonic():
                            continue  # failed earlier in this pass
                        try:
                            handled = relays[target].deliver_batch(batch_size)
                        except UNAVAILABLE as exc:
                            if once:
                                unavailable[alias] = exc
                            else:
                                outages[alias].failed(exc)
                            continue
                        except DatabaseError as exc:
                            if not tenants.dropped_during(*target, exc, "outbox relay"):
                                raise
                            self._forget(relays, target)
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
                    for target, each in list(relays.items()):
                        if not outages[target[0]].down:
                            try:
                                each.close()
                            except UNAVAILABLE as exc:
                                outages[target[0]].failed(exc)
                            except DatabaseError as exc:
                                if not tenants.dropped_during(*target, exc, "outbox relay"):
                                    raise
                                self._forget(relays, target)
                    pause = options["interval"]
                    down = [o for o in outages.values() if o.down]
                    if down:
                        pause = min(pause, min(o.retry_at for o in down) - time.monotonic())
                    stop.sleep(pause)  # poll interval or backoff, not synchronisation
                    self._discover(relays, aliases, outages, unavailable, once, threads)
        except KeyboardInterrupt:
            pass
        finally:
            unmarked = self._close(relays)
        if stop.requested:
            logger.info("outbox relay stopped on SIGTERM")
        everyone = [*relays.values(), *self._dropped]
        total = sum(each.handled for each in everyone)
        self.stdout.write(
            ngettext(
                "Handled %(count)d outbox message.", "Handled %(count)d outbox messages.", total
            )
            % {"count": total}
        )
        if total:
            self.stdout.write(outcome_line(everyone))
        problems = [f"database {alias!r} unavailable: {exc}" for alias, exc in unavailable.items()]
        problems += [
            f"database {tenants.label(*target)!r}: {count} delivered message(s) not marked "
            f"sent, delivered again after the relay lease: {exc}"
            for target, (count, exc) in unmarked.items()
        ]
        if problems:
            raise CommandError("; ".join(problems))

    def _discover(
        self,
        relays: dict[Target, relay.Relay],
        aliases: tuple[str, ...],
        outages: dict[str, Outage],
        unavailable: dict[str, BaseException],
        once: bool,
        threads: int | None,
    ) -> None:
        """Add a relay for each database and tenant schema not covered yet.

        A tenant schema created since the last look gets its relay; one dropped since
        loses it. A database that cannot be asked is an outage, as a failed batch is.
        """
        for alias in aliases:
            if alias in unavailable or outages[alias].retry_at > time.monotonic():
                continue
            try:
                found = tenants.targets((alias,))
            except UNAVAILABLE as exc:
                if once:
                    unavailable[alias] = exc
                else:
                    outages[alias].failed(exc)
                continue
            for target in found:
                if target not in relays:
                    relays[target] = relay.Relay(alias, threads=threads, schema=target[1])
            for target in [t for t in relays if t[0] == alias and t not in found]:
                self._forget(relays, target)

    def _forget(self, relays: dict[Target, relay.Relay], target: Target) -> None:
        """Stop relaying a tenant schema that was dropped (its handled count is kept)."""
        gone = relays.pop(target)
        self._dropped.append(gone)
        with contextlib.suppress(DatabaseError):  # its tables went with the schema
            gone.close()

    def _close(self, relays: dict[Target, relay.Relay]) -> dict[Target, tuple[int, BaseException]]:
        """Close every relay (its last marks); the marks the database refused, by target.

        Every relay is closed (its marks written, its threads and their connections
        ended) even when an earlier one fails with an error that is not an outage;
        the first such error is raised after.
        """
        unmarked: dict[Target, tuple[int, BaseException]] = {}
        error: DatabaseError | None = None
        for target, each in list(relays.items()):
            try:
                each.close()
            except UNAVAILABLE as exc:
                unmarked[target] = (each.unmarked, exc)
            except DatabaseError as exc:
                if not tenants.dropped_during(*target, exc, "outbox relay") and error is None:
                    error = exc
        if error is not None:
            raise error
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
