"""The Redis server the Celery tests use (127.0.0.1:6379)."""

from __future__ import annotations

import socket

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def redis_unreachable() -> str | None:
    try:
        socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=2).close()
    except OSError as exc:
        return f"Redis at {REDIS_HOST}:{REDIS_PORT} is unreachable ({exc})"
    return None
