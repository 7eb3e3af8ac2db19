"""Python memory per request against the size of the body: first execution and replay.

Not a test: a measurement. In one process (Django's test client, no HTTP), a view that
answers a body of ``--mb`` megabytes is called without a key (the yardstick), with a new
key (a first execution: the body is stored) and with that key again (a replay: the body
is read back and sent), for a plain ``HttpResponse`` and a ``StreamingHttpResponse`` of
64 KiB chunks. ``tracemalloc`` gives each request's peak of Python allocations; the
script prints it in MB and as a multiple of the body's size. The test client keeps the
response's content, one copy of the body, in every mode, the unkeyed one included.

Usage (SQLite in a temporary file by default; ``DATABASE_URL`` for PostgreSQL)::

    python benchmarks/memory.py --mb 5
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python benchmarks/memory.py

``MAX_RESPONSE_BYTES`` is raised above the body's size so that it is stored.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

CHUNK = 64 * 1024


def configure(body_bytes: int) -> None:
    import environ

    default = f"sqlite:///{tempfile.mkdtemp()}/memory.sqlite3"
    settings.configure(
        DEBUG=False,
        SECRET_KEY="benchmark-only",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=__name__,
        DATABASES={"default": environ.Env().db("DATABASE_URL", default=default)},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_idempotency"],
        MIDDLEWARE=[],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        IDEMPOTENCY={
            "REQUIRED": False,
            "OUTBOX_KICK": False,
            "MAX_RESPONSE_BYTES": body_bytes + 1024,
            "PRINCIPAL_RESOLVER": lambda request: "bench",
        },
    )
    django.setup()


BODY = b""
urlpatterns: list[Any] = []


def views() -> list[Any]:
    from django.http import HttpResponse, StreamingHttpResponse
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    from django_idempotency import idempotent

    @csrf_exempt
    @idempotent
    def plain(request: Any) -> HttpResponse:
        return HttpResponse(BODY, content_type="application/octet-stream", status=201)

    @csrf_exempt
    @idempotent
    def streaming(request: Any) -> StreamingHttpResponse:
        chunks = (BODY[i : i + CHUNK] for i in range(0, len(BODY), CHUNK))
        return StreamingHttpResponse(chunks, content_type="application/octet-stream", status=201)

    return [path("plain", plain), path("streaming", streaming)]


def peak(call: Any) -> float:
    """Peak Python allocations (bytes) while ``call()`` runs, above what was live before."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    call()
    return float(tracemalloc.get_traced_memory()[1] - before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=5.0, help="body size in MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=3, help="requests per mode (max kept)")
    args = parser.parse_args()
    global BODY
    BODY = os.urandom(int(args.mb * 1_000_000))
    configure(len(BODY))
    urlpatterns.extend(views())

    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    call_command("migrate", verbosity=0)
    client = Client()

    def post(path: str, key: str | None, *, replay: bool = False) -> None:
        extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        response = client.post(f"/{path}", b"{}", content_type="application/json", **extra)
        content = b"".join(response.streaming_content) if response.streaming else response.content
        assert response.status_code == 201 and len(content) == len(BODY), response.status_code
        assert (response.get("Idempotent-Replayed") == "true") == replay, "unexpected replay"

    print(
        f"{connection.vendor}, Python {sys.version.split()[0]}, Django {django.get_version()}, "
        f"body {len(BODY) / 1e6:.1f} MB, the highest of {args.repeat} requests per mode\n"
    )
    print("| response | request | peak Python memory | x body |")
    print("| --- | --- | ---: | ---: |")
    tracemalloc.start()
    try:
        for path in ("plain", "streaming"):
            post(path, None)  # warm-up: imports, connection, caches
            keys = [str(uuid.uuid4()) for _ in range(args.repeat)]
            rows = {
                "unkeyed": [peak(lambda p=path: post(p, None)) for _ in keys],
                "first execution": [peak(lambda p=path, k=k: post(p, k)) for k in keys],
                "replay": [peak(lambda p=path, k=k: post(p, k, replay=True)) for k in keys],
            }
            for mode, peaks in rows.items():
                print(
                    f"| {path} | {mode} | {max(peaks) / 1e6:.1f} MB "
                    f"| {max(peaks) / len(BODY):.2f} |"
                )
    finally:
        tracemalloc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
