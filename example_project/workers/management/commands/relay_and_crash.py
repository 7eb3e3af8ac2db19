"""``manage.py relay_and_crash``: a relay killed between delivering and marking sent.

One relay pass whose ``worker.provisioned`` handler kills its own process (SIGKILL)
right after the notice was delivered, before the relay can mark the message sent: the
message stays pending, and once the relay's lease (``--lease`` seconds) is over the
next relay delivers it again, with the same dedup key. The demo runs it to show that
the receiver (``POST /hooks/billing``) records the event once anyway.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_idempotency import outbox
from django_idempotency.outbox import relay
from workers import notifications


class Command(BaseCommand):
    help = "Deliver due notices, then die (SIGKILL) before marking them sent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lease", type=float, default=1.0, help="relay lease, seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        def deliver_then_die(message: Any, dedup_key: str) -> None:
            notifications.send_provisioned(message, dedup_key)
            self.stdout.write(f"delivered {dedup_key} (then killed before marking it sent)")
            self.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        outbox.unregister(notifications.TOPIC)
        outbox.register(notifications.TOPIC)(deliver_then_die)
        relay.deliver_batch(lease=options["lease"])
        self.stdout.write("nothing was due")
