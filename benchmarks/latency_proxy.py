"""A loopback TCP proxy that delays what it forwards: a network between app and database.

Benchmarks on one machine talk to PostgreSQL over loopback, where a round trip costs
tens of microseconds; in production the app and the database are usually a network
apart, where it costs 0.2 to 2 ms, and a mechanism that saves a round trip matters
more. This proxy puts that distance back: it listens on ``127.0.0.1:<port>``, forwards
every connection to the target, and holds each chunk it reads for ``delay`` seconds
before writing it on, in each direction, in the order it was read. A delay of 0.5 ms
each way is a 1 ms round trip.

Each connection gets four threads: a reader and a writer per direction. A writer
sleeps until its chunk is due (``time.sleep``, whose precision on Linux is tens of
microseconds; ``selectors`` round their timeouts up to the millisecond, too coarse
for 0.5 ms). A chunk read while earlier ones wait keeps its own deadline, so the
delay adds latency without limiting throughput (a link with room to spare, not a slow
one). Usage, standalone::

    python benchmarks/latency_proxy.py --listen 6433 --target 127.0.0.1:5432 --delay-ms 0.5

or in a benchmark, as a context manager that runs it in a child process (its CPU is
then apart from the benchmark's own and reported by ``cpu_seconds``)::

    with LatencyProxy(("127.0.0.1", 5432), delay=0.0005) as proxy:
        url = f"postgres://postgres@127.0.0.1:{proxy.port}/postgres"

It counts the chunks it forwards towards the target (``sent()``): with a client that
waits for each answer, such as a Django worker, one chunk is one round trip, so the
count per request tells how many round trips a request took.

The proxy adds its own cost (a thread hand-off per chunk, about 20-50 us on an idle
core); with ``delay=0`` it measures just that, the yardstick to compare the delayed
runs with.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536
#: Chunks forwarded towards the target, by every connection of this process.
_sent = [0]
_sent_lock = threading.Lock()


class _Pipe:
    """One direction of one connection: read from ``source``, write to ``sink`` later."""

    def __init__(
        self, source: socket.socket, sink: socket.socket, delay: float, *, upstream: bool
    ) -> None:
        self.source, self.sink, self.delay, self.upstream = source, sink, delay, upstream
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while data := self.source.recv(CHUNK):
                if self.upstream:
                    with _sent_lock:
                        _sent[0] += 1
                with self.ready:
                    self.queue.append((time.monotonic() + self.delay, data))
                    self.ready.notify()
        except OSError:
            pass
        finally:
            with self.ready:
                self.closed = True
                self.ready.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue and not self.closed:
                        self.ready.wait()
                    if not self.queue:
                        break
                    due, data = self.queue.popleft()
                left = due - time.monotonic()
                if left > 0:
                    time.sleep(left)
                self.sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (self.sink, self.source):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    """Accept connections on ``listen`` forever, each forwarded to ``target``, delayed.

    Args:
        listen: host and port to listen on (port 0: any free port; printed on stdout).
        target: host and port to forward to.
        delay: seconds each chunk waits, in each direction.
    """
    server = socket.create_server(listen, reuse_port=False)
    print(server.getsockname()[1], flush=True)
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(target)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _Pipe(client, upstream, delay, upstream=True).start()
        _Pipe(upstream, client, delay, upstream=False).start()


class LatencyProxy:
    """:func:`serve` in a child process, for the length of a ``with`` block.

    Args:
        target: host and port to forward to (PostgreSQL's).
        delay: seconds each chunk waits, in each direction (0.0005: a 1 ms round trip).

    Attributes:
        port: the port the proxy listens on (127.0.0.1), once started.
    """

    def __init__(self, target: tuple[str, int], *, delay: float) -> None:
        self.target, self.delay = target, delay
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> LatencyProxy:
        command = [
            *(sys.executable, str(Path(__file__).resolve())),
            *("--listen", "0", "--target", f"{self.target[0]}:{self.target[1]}"),
            *("--delay-ms", str(self.delay * 1000)),
        ]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())
        return self

    def sent(self) -> int:
        """Chunks forwarded towards the target so far, by every connection (round trips)."""
        assert self._process is not None and self._process.stdout is not None
        self._process.send_signal(signal.SIGUSR1)
        return int(self._process.stdout.readline())

    def cpu_seconds(self) -> float:
        """CPU the proxy process used so far (user + system; Linux ``/proc``)."""
        assert self._process is not None
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(timeout=10)


def behind_proxy(
    stack: contextlib.ExitStack[Any], url: str, delay_ms: float
) -> tuple[LatencyProxy, str]:
    """Start a proxy in front of ``url``'s server for the life of ``stack``.

    Returns the proxy and ``url`` pointed at it, after printing the ``SELECT 1`` round
    trip through it beside the direct one.

    Args:
        stack: the ``ExitStack`` that stops the proxy.
        url: a ``postgres://`` URL.
        delay_ms: milliseconds each chunk waits, in each direction.
    """
    parts = urlsplit(url)
    target = (parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy = stack.enter_context(LatencyProxy(target, delay=delay_ms / 1000))
    proxied = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    print(
        f"  database behind the latency proxy, {delay_ms} ms each way: SELECT 1 round trip "
        f"{round_trip(proxied) * 1000:.2f} ms (direct {round_trip(url) * 1000:.2f} ms)"
    )
    return proxy, proxied


def round_trip(url: str, *, samples: int = 200) -> float:
    """Median seconds of ``SELECT 1`` over ``url`` (a PostgreSQL URL), after a warm-up."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        timings = []
        for n in range(samples + 20):
            started = time.perf_counter()
            connection.execute("SELECT 1").fetchone()
            if n >= 20:
                timings.append(time.perf_counter() - started)
    return sorted(timings)[len(timings) // 2]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host or "127.0.0.1", int(port))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="0", help="[host:]port to listen on (0: any)")
    parser.add_argument("--target", default="127.0.0.1:5432", help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="delay each way, ms")
    args = parser.parse_args(argv)
    listen = _address(args.listen) if ":" in args.listen else ("127.0.0.1", int(args.listen))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: print(_sent[0], flush=True))
    serve(listen, _address(args.target), args.delay_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
