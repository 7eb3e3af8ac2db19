"""A process that claims a key and holds it: the owner of tests/store/test_presence.py.

Run as ``python -m tests.support.presence_owner PRINCIPAL ENDPOINT KEY FINGERPRINT LEASE`` with
``DATABASE_URL`` naming the test database (and ``IDEMPOTENCY_OWNER_PRESENCE`` =
``auto``/``true``/``false``). It claims the scope on its own connection, prints one
JSON line (its pid, whether its session holds the presence lock, its backend pid),
then obeys commands read from stdin, one per line: ``complete`` (completes the claim
with a 201 and prints ``completed``), ``exit``. Killed or stopped by the test with
signals, it is the crashed or stalled owner.
"""

from __future__ import annotations

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from django_idempotency import store  # noqa: E402


def main() -> None:
    principal, endpoint, key, fp, lease = sys.argv[1:6]
    mode = os.environ.get("IDEMPOTENCY_OWNER_PRESENCE", "auto")
    settings.IDEMPOTENCY = {
        **getattr(settings, "IDEMPOTENCY", {}),
        "OWNER_PRESENCE": {"true": True, "false": False}.get(mode, mode),
    }
    claim = store.claim(
        store.Scope(principal, endpoint, key), fp, lease=float(lease), retention=3600
    )
    assert isinstance(claim, store.Claim), claim
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    print(json.dumps({"pid": os.getpid(), "present": claim.present, "backend": backend}))
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip() == "complete":
            with transaction.atomic():
                store.complete(claim, store.StoredResponse(201, [], b'{"done": true}'))
            print("completed", flush=True)
        elif line.strip() == "exit":
            return


if __name__ == "__main__":
    main()
