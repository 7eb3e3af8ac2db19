"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1: the unreliable network of the storm.

Every client connection carries one request (the proxy answers ``Connection: close``).
For each unsafe request (POST, PUT, PATCH, DELETE) the proxy draws one fault:

* ``pass``: forward the request, forward the response.
* ``drop``: forward the request, read the whole response (so the view has run and
  committed), then close the client's connection without a byte: the client sees a
  reset and cannot know whether the request took effect.
* ``stall-request``: hold the request longer than the client's timeout, then forward
  it anyway: the client has given up and retried, and the original arrives late,
  racing the retry (or after it).
* ``stall-response``: forward the request, hold the response past the client's
  timeout, then send it to a client that has gone.
* ``duplicate``: send the request upstream twice at once (a retrying middlebox) and
  forward whichever answer comes first.

A client may force a fault with the ``X-Storm-Fault`` header (stripped before
forwarding); the demo uses it to crash a client right after a dropped response.
Safe methods always pass. Only loopback addresses are used, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import queue
import random
import socket
import socketserver
import threading
from collections import Counter
from dataclasses import dataclass
from typing import BinaryIO

FAULT_HEADER = "x-storm-fault"
FAULTS = ("pass", "drop", "stall-request", "stall-response", "duplicate")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        FAULT_HEADER,
    }
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_HEADER_LINES = 100
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class FaultRates:
    """Probability of each fault for one unsafe request; the rest pass."""

    drop: float = 0.15
    stall_request: float = 0.05
    stall_response: float = 0.05
    duplicate: float = 0.15

    def draw(self, rng: random.Random) -> str:
        roll = rng.random()
        for name, rate in (
            ("drop", self.drop),
            ("stall-request", self.stall_request),
            ("stall-response", self.stall_response),
            ("duplicate", self.duplicate),
        ):
            if roll < rate:
                return name
            roll -= rate
        return "pass"


NO_FAULTS = FaultRates(0.0, 0.0, 0.0, 0.0)


@dataclass
class Upstream:
    """An answer read from the server."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class _BadRequest(Exception):
    pass


def _read_request(reader: BinaryIO) -> tuple[str, str, list[tuple[str, str]], bytes]:
    line = reader.readline(65537)
    if not line:
        raise EOFError
    try:
        method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    except ValueError:
        raise _BadRequest(line) from None
    headers: list[tuple[str, str]] = []
    for _ in range(MAX_HEADER_LINES):
        raw = reader.readline(65537).decode("latin-1")
        if raw in ("\r\n", "\n", ""):
            break
        name, _, value = raw.partition(":")
        headers.append((name.strip(), value.strip()))
    else:
        raise _BadRequest("too many header lines")
    lengths = [v for n, v in headers if n.lower() == "content-length"]
    if any(n.lower() == "transfer-encoding" for n, _ in headers):
        raise _BadRequest("chunked request bodies are not supported")
    length = int(lengths[0]) if lengths else 0
    if length > MAX_BODY:
        raise _BadRequest("body too large")
    body = reader.read(length) if length else b""
    return method.upper(), target, headers, body


class FaultProxy:
    """The proxy: ``start()`` it, point clients at ``url``, ``drain()`` and ``stop()``.

    Args:
        upstream_port: the server's port on 127.0.0.1.
        rates: fault probabilities (``NO_FAULTS`` to pass everything).
        stall: seconds a stalled request or response is held (longer than the
            clients' timeout).
        seed: seeds the fault draws.
    """

    def __init__(
        self, upstream_port: int, *, rates: FaultRates, stall: float, seed: int = 0
    ) -> None:
        self.upstream_port = upstream_port
        self.rates = rates
        self.stall = stall
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._busy = 0
        self._stopping = threading.Event()
        self._server: socketserver.ThreadingTCPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def drain(self, timeout: float) -> bool:
        """Wait until no request is being handled (stalls and duplicates included)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout=timeout)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()

    def _enter(self) -> None:
        with self._lock:
            self._busy += 1

    def _leave(self) -> None:
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    # -- one connection --------------------------------------------------------------

    def _handle(self, client: socket.socket) -> None:
        self._enter()
        try:
            stream = client.makefile("rb")
            try:
                method, target, headers, body = _read_request(stream)
            except (EOFError, OSError):
                return
            except (_BadRequest, ValueError):
                self._send(client, Upstream(400, "Bad Request", [], b"bad request\n"))
                return
            fault = self._choose(method, headers)
            self._count(fault)
            self._serve(client, fault, method, target, headers, body)
        finally:
            self._close(client)
            self._leave()

    def _choose(self, method: str, headers: list[tuple[str, str]]) -> str:
        forced = next((v for n, v in headers if n.lower() == FAULT_HEADER), "")
        if forced in FAULTS:
            return forced
        if method in SAFE_METHODS:
            return "pass"
        with self._lock:
            return self.rates.draw(self.rng)

    def _serve(
        self,
        client: socket.socket,
        fault: str,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        if fault == "stall-request" and self._stopping.wait(self.stall):
            return
        if fault == "duplicate":
            answer = self._forward_twice(method, target, headers, body)
        else:
            answer = self._forward(method, target, headers, body)
        if answer is None:
            self._send(client, Upstream(502, "Bad Gateway", [], b"upstream failed\n"))
            return
        if fault == "drop":
            return  # the view ran and committed; the client hears nothing
        if fault == "stall-response" and self._stopping.wait(self.stall):
            return
        self._send(client, answer)

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Upstream | None:
        self._count("upstream requests")
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            sent = {n: v for n, v in headers if n.lower() not in HOP_BY_HOP}
            sent["Content-Length"] = str(len(body))
            sent["Connection"] = "close"
            conn.request(method, target, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
            return Upstream(response.status, response.reason, response.getheaders(), data)
        except (OSError, http.client.HTTPException):
            self._count("upstream errors")
            return None
        finally:
            conn.close()

    def _forward_twice(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Upstream | None:
        answers: queue.Queue[Upstream | None] = queue.Queue()

        def copy() -> None:
            try:
                answers.put(self._forward(method, target, headers, body))
            finally:
                self._leave()

        for _ in range(2):
            self._enter()  # drain() also waits for the copy whose answer is dropped
            threading.Thread(target=copy, daemon=True).start()
        first = answers.get(timeout=120)
        return first if first is not None else answers.get(timeout=120)

    # -- writing back ----------------------------------------------------------------

    @staticmethod
    def _send(client: socket.socket, answer: Upstream) -> None:
        lines = [f"HTTP/1.1 {answer.status} {answer.reason}"]
        lines += [f"{n}: {v}" for n, v in answer.headers if n.lower() not in HOP_BY_HOP]
        lines += [f"Content-Length: {len(answer.body)}", "Connection: close", "", ""]
        with contextlib.suppress(OSError):  # the client gave up (timeout) and left
            client.sendall("\r\n".join(lines).encode("latin-1") + answer.body)

    @staticmethod
    def _close(client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()
