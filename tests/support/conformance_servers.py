"""Small WSGI servers for the conformance check: one that keeps the promise, several that don't.

:class:`KeyedOrders` is a correct in-memory ``Idempotency-Key`` endpoint (``POST
/orders``, principal = the ``Authorization`` header) with ``GET /count`` as its effect
counter. Each ``broken`` flag breaks it in one way a real deployment can:

* ``cache_then_execute``: a cache middleware that looks the key up, runs the handler,
  then stores the answer, with no claim in between: concurrent duplicates all run. The
  first two executions meet at a barrier, so two duplicates always overlap;
* ``shared_across_principals``: answers stored by key alone, replayed to anyone;
* ``replay_drops_media_type``: the replay loses its ``Content-Type``;
* ``crash_on_bad_key``: a key it cannot parse is a 500;
* ``blocks_duplicates``: a duplicate in flight waits for the original, then replays;
* ``ignores_body``: the same key with another body gets the first answer;
* ``no_replay_marker``, ``replays_cookies``: the replay lacks ``Idempotent-Replayed``,
  or repeats the first answer's ``Set-Cookie`` and ``X-Request-Id``;
* ``replays_date``: the handler sets ``Date`` itself, and the replay repeats it;
* ``no_retry_after``, ``plain_json_errors``: a 409 without ``Retry-After``; errors as
  ``application/json``;
* ``keys_on_safe_methods``: a GET with an invalid key is refused;
* ``crash_one_duplicate``: the first duplicate of the first key is answered 500 (a
  worker that failed under load), the request still runs once.

:func:`strip_header` is a proxy in front of any of them that removes the header.
:func:`serve` runs a WSGI app on 127.0.0.1 in a thread (wsgiref, one thread per request).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

Answer = tuple[str, list[tuple[str, str]], bytes]

PROBLEM = "application/problem+json"
MAX_KEY = 255
#: Seconds a slow handler (``?slow=1``) or a barrier waits at most; never reached in a pass.
WAIT_LIMIT = 5.0


@dataclass
class Stored:
    fingerprint: str
    done: threading.Event = field(default_factory=threading.Event)
    duplicate: threading.Event = field(default_factory=threading.Event)
    status: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


class KeyedOrders:
    """``POST /orders`` protected by ``Idempotency-Key``; ``GET /count``: its executions.

    Args:
        broken: the names of the faults to have (see the module's docstring).
    """

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)
        self.executions = 0
        self.records: dict[tuple[str, str], Stored] = {}
        self.lock = threading.Lock()
        self.pair: threading.Barrier | None = (
            threading.Barrier(2) if "cache_then_execute" in self.broken else None
        )

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        status, headers, body = self.handle(environ)
        start_response(status, headers)
        return [body]

    def handle(self, environ: Environ) -> Answer:
        path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
        if path == "/count":
            return (
                "200 OK",
                [("Content-Type", "application/json")],
                b'{"count": %d}' % (self.executions),
            )
        if path != "/orders":
            return "404 Not Found", [("Content-Type", "text/plain")], b"not found"
        if method == "GET":
            key = environ.get("HTTP_IDEMPOTENCY_KEY")
            if key is not None and "keys_on_safe_methods" in self.broken and self.key_error(key):
                return self.problem("400 Bad Request", "invalid-key", self.key_error(key))
            return "200 OK", [("Content-Type", "application/json")], b"[]"
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        principal = environ.get("HTTP_AUTHORIZATION", "")
        if not principal:
            return self.problem("401 Unauthorized", "no-principal", "authenticate")
        raw = environ.get("HTTP_IDEMPOTENCY_KEY")
        if raw is None:
            return self.problem("400 Bad Request", "missing-key", "this endpoint needs a key")
        wrong = self.key_error(raw)
        if wrong:
            if "crash_on_bad_key" in self.broken:
                return "500 Internal Server Error", [("Content-Type", "text/plain")], b"oops"
            return self.problem("400 Bad Request", "invalid-key", wrong)
        fingerprint = hashlib.sha256(
            environ.get("CONTENT_TYPE", "").encode() + b"\0" + body
        ).hexdigest()
        if "ignores_body" in self.broken:
            fingerprint = ""
        scope = ("", raw) if "shared_across_principals" in self.broken else (principal, raw)
        if "cache_then_execute" in self.broken:
            return self.cache_then_execute(scope, fingerprint, environ, body)
        with self.lock:
            record = self.records.get(scope)
            if record is None:
                record = self.records[scope] = Stored(fingerprint)
                claimed = True
            else:
                claimed = False
        if not claimed:
            return self.answer_duplicate(record, fingerprint)
        answer = self.execute(environ, body, record)
        record.status, record.headers, record.body = answer
        record.done.set()
        return answer

    def problem(self, status: str, slug: str, detail: str, **headers: str) -> Answer:
        body = {"type": f"tag:test,2026:problems#{slug}", "title": slug, "status": int(status[:3])}
        body["detail"] = detail
        media_type = "application/json" if "plain_json_errors" in self.broken else PROBLEM
        if "no_retry_after" in self.broken:
            headers.pop("Retry-After", None)
        return status, [("Content-Type", media_type), *headers.items()], json.dumps(body).encode()

    @staticmethod
    def key_error(raw: str) -> str:
        key = raw.strip()
        if not key:
            return "the key is empty"
        if len(key) > MAX_KEY:
            return "the key is too long"
        if any(not " " <= c <= "~" for c in key):
            return "the key is not printable ASCII"
        if "," in key:
            return "the header was sent twice"
        return ""

    def answer_duplicate(self, record: Stored, fingerprint: str) -> Answer:
        if "crash_one_duplicate" in self.broken:
            self.broken.discard("crash_one_duplicate")
            return "500 Internal Server Error", [("Content-Type", "text/plain")], b"oops"
        if record.fingerprint != fingerprint:
            return self.problem("422 Unprocessable Content", "key-reused", "another request")
        if not record.done.is_set() and "blocks_duplicates" in self.broken:
            record.duplicate.set()
            record.done.wait(WAIT_LIMIT)
        if not record.done.is_set():
            answer = self.problem(
                "409 Conflict", "request-in-flight", "in flight", **{"Retry-After": "1"}
            )
            record.duplicate.set()
            return answer
        return self.replay(record)

    def replay(self, record: Stored) -> Answer:
        headers = record.headers
        if "replays_cookies" not in self.broken:
            headers = [(n, v) for n, v in headers if n not in ("Set-Cookie", "X-Request-Id")]
        if "replay_drops_media_type" in self.broken:
            headers = [(n, v) for n, v in headers if n != "Content-Type"]
        if "no_replay_marker" not in self.broken:
            headers = [*headers, ("Idempotent-Replayed", "true")]
        return record.status, headers, record.body

    def cache_then_execute(
        self, scope: tuple[str, str], fingerprint: str, environ: Environ, body: bytes
    ) -> Answer:
        record = self.records.get(scope)
        if record is not None and record.done.is_set():
            if record.fingerprint != fingerprint:
                return self.problem("422 Unprocessable Content", "key-reused", "another request")
            return self.replay(record)
        stored = Stored(fingerprint)
        answer = self.execute(environ, body, stored)
        stored.status, stored.headers, stored.body = answer
        stored.done.set()
        self.records[scope] = stored
        return answer

    def execute(self, environ: Environ, body: bytes, record: Stored) -> Answer:
        """The handler: one effect, a 201 with a new order, a cookie and a request id."""
        if self.pair is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.pair.wait(WAIT_LIMIT)  # the first two executions overlap
            self.pair = None
        if "slow=1" in environ.get("QUERY_STRING", ""):
            record.duplicate.wait(WAIT_LIMIT)  # runs until a duplicate was answered 409
        with self.lock:
            self.executions += 1
            number = self.executions
        payload = json.dumps({"id": number, "request": body.decode("utf-8", "replace")})
        headers = [
            ("Content-Type", "application/json"),
            ("Location", f"/orders/{number}"),
            ("Set-Cookie", f"session={uuid.uuid4().hex}"),
            ("X-Request-Id", uuid.uuid4().hex),
        ]
        if "replays_date" in self.broken:  # a Date of its own, stored and replayed
            headers = [*headers[:2], ("Date", formatdate(usegmt=True))]
        return "201 Created", headers, payload.encode()


def strip_header(app: WSGIApp, name: str = "HTTP_IDEMPOTENCY_KEY") -> WSGIApp:
    """A proxy in front of ``app`` that drops the ``Idempotency-Key`` request header."""

    def proxy(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        environ.pop(name, None)
        return app(environ, start_response)

    return proxy


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(app: WSGIApp) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    server = make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
