"""Sending: only to the endpoint (and the effect URL), within a request cap and a deadline.

Every request of a run goes through one :class:`Sender`. It refuses a URL it was not
given, a request past the cap, and a request after the time budget, so no check, however
written, can send more or elsewhere. It records each exchange for the report.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from django_idempotency.client.responses import HEADER, is_replay, problem_slug
from django_idempotency.conformance.config import Config

#: The prefix of every key the check mints, so the endpoint's logs show its traffic.
KEY_PREFIX = "conformance-"

HeaderList = Sequence[tuple[str, str | bytes]]


def new_key() -> str:
    """A fresh key: ``conformance-`` and a version 4 UUID (48 characters)."""
    return f"{KEY_PREFIX}{uuid.uuid4()}"


class BudgetExhausted(Exception):
    """The request cap or the time budget of the run is used up; nothing more is sent."""


class ForbiddenURL(Exception):
    """A request to a URL the run was not given (a defect of a check, never sent)."""


@dataclass
class Exchange:
    """One request and what came back.

    Attributes:
        label: what the request was for (``"replay #2"``).
        method: the method sent.
        url: the URL sent to.
        status: the response status, ``None`` when no response came (``error`` says why).
        headers: the response headers.
        body: the response body bytes.
        started: ``time.monotonic()`` when the request was sent.
        finished: ``time.monotonic()`` when the answer (or the error) came.
        error: the transport error, if any.
        sent_at: wall-clock time (``time.time()``) when the request was sent.
        received_at: wall-clock time when the answer (or the error) came.
    """

    label: str
    method: str
    url: str
    status: int | None = None
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    body: bytes = b""
    started: float = 0.0
    finished: float = 0.0
    error: str | None = None
    sent_at: float = 0.0
    received_at: float = 0.0

    @property
    def elapsed(self) -> float:
        """Seconds between sending and the answer."""
        return self.finished - self.started

    @property
    def replayed(self) -> bool:
        """The answer carries ``Idempotent-Replayed: true``."""
        return is_replay(self.response())

    @property
    def problem_json(self) -> bool:
        """The answer's Content-Type is ``application/problem+json``."""
        content_type: str = self.headers.get("Content-Type", "")
        return content_type.startswith("application/problem+json")

    @property
    def slug(self) -> str:
        """The slug of the answer's problem ``type`` (``"missing-key"``), ``""`` if none."""
        return problem_slug(self.response())

    def response(self) -> httpx.Response:
        """The answer as an ``httpx.Response`` (status 0 when none came)."""
        return httpx.Response(self.status or 0, headers=self.headers, content=self.body)

    def summary(self) -> str:
        """``"201"``, ``"409 [request-in-flight]"``, ``"no answer: ReadTimeout"``."""
        if self.status is None:
            return f"no answer: {self.error}"
        slug = self.slug
        return f"{self.status} [{slug}]" if slug else str(self.status)


class Sender:
    """Sends the run's requests, within its URLs, cap and deadline.

    Args:
        config: the run; its ``url``, ``slow_url`` and ``effect_url`` are the only
            URLs requests may go to.
        transport: an httpx transport (tests); ``None``: the network.
        clock: seconds from an arbitrary origin (default ``time.monotonic``); the
            deadline and the exchanges' times are read from it.

    Raises (from :meth:`send`):
        BudgetExhausted: the cap or the deadline is reached.
        ForbiddenURL: the URL is not one of the run's.
    """

    def __init__(
        self,
        config: Config,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.allowed = {u for u in (config.url, config.slow_url, config.effect_url) if u}
        self.deadline = clock() + config.time_budget
        self.sent = 0
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        limits = httpx.Limits(max_connections=config.concurrency + 4)
        self.http = httpx.Client(
            timeout=config.timeout, limits=limits, transport=transport, follow_redirects=False
        )

    def close(self) -> None:
        """Close the connections."""
        self.http.close()

    def remaining(self) -> float:
        """Seconds left in the time budget."""
        return self.deadline - self.clock()

    def send(
        self,
        label: str,
        *,
        method: str | None = None,
        url: str | None = None,
        key: str | None = None,
        headers: HeaderList = (),
        body: bytes | None = None,
        content_type: str | None = None,
        principal: HeaderList | None = None,
    ) -> Exchange:
        """Send one request; transport errors are recorded in the exchange, not raised.

        Args:
            label: what it is for, in the report.
            method: default the endpoint's method.
            url: default the endpoint's URL.
            key: sent as ``Idempotency-Key`` (``None``: no key from this argument).
            headers: more header lines, sent as given (two lines of one name stay two).
            body: default the configured body.
            content_type: the body's Content-Type; default the configured one when
                ``body`` is the configured body.
            principal: the principal's headers (default ``config.headers``).
        """
        method = method or self.config.method
        url = url or self.config.url
        if url not in self.allowed:
            raise ForbiddenURL(f"{url} is not one of the URLs this run was given")
        if body is None:
            body, content_type = self.config.body, content_type or self.config.content_type
        lines: list[tuple[str, str | bytes]] = list(
            self.config.headers if principal is None else principal
        )
        if content_type and body:
            lines.append(("Content-Type", content_type))
        if key is not None:
            lines.append((HEADER, key))
        lines.extend(headers)
        with self._lock:
            timeout = min(self.config.timeout, self.remaining())
            if self.sent >= self.config.max_requests:
                raise BudgetExhausted(
                    f"stopped after {self.sent} requests: the cap of {self.config.max_requests}"
                )
            if timeout <= 0:
                raise BudgetExhausted(
                    f"stopped after {self.sent} requests: the time budget of "
                    f"{self.config.time_budget:g} s ran out"
                )
            self.sent += 1
        exchange = Exchange(label, method, url, started=self.clock(), sent_at=time.time())
        try:
            response = self.http.request(
                method, url, headers=_encoded(lines), content=body or None, timeout=timeout
            )
        except httpx.TransportError as exc:
            exchange.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            exchange.status = response.status_code
            exchange.headers = response.headers
            exchange.body = response.content
        exchange.finished, exchange.received_at = self.clock(), time.time()
        with self._lock:
            self.exchanges.append(exchange)
        return exchange

    def effects(self) -> float | None:
        """The effect counter's current value, ``None`` if no counter was given.

        Raises:
            EffectCounterError: the counter did not answer a number.
        """
        if self.config.effect_command:
            return _run_command(self.config.effect_command, self.config.timeout)
        if not self.config.effect_url:
            return None
        exchange = self.send("effect counter", method="GET", url=self.config.effect_url, body=b"")
        if exchange.status != 200:
            raise EffectCounterError(
                f"the effect URL answered {exchange.summary()}, not 200 and a number"
            )
        return _number_in(exchange.body, self.config.effect_field)


def _encoded(lines: HeaderList) -> list[tuple[bytes, bytes]]:
    """Header lines as bytes, in order (a ``str`` value as UTF-8)."""
    return [
        (name.encode("ascii"), value if isinstance(value, bytes) else value.encode("utf-8"))
        for name, value in lines
    ]


class EffectCounterError(Exception):
    """The effect counter (URL or command) did not give a number; the message says what."""


def _run_command(command: str, timeout: float) -> float:
    try:
        done = subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise EffectCounterError(f"the effect command ran over {timeout:.0f} s") from None
    if done.returncode != 0:
        raise EffectCounterError(
            f"the effect command exited {done.returncode}: {done.stderr.strip()[-200:]}"
        )
    return _number_in(done.stdout.encode(), None)


def _number_in(text: bytes, path: str | None) -> float:
    """The number in ``text``: bare, or in its JSON at ``path``; a list counts its items."""
    try:
        value: object = json.loads(text)
    except ValueError:
        raise EffectCounterError(f"the effect counter gave {text[:80]!r}, not a number") from None
    for part in (path or "").split(".") if path else ():
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise EffectCounterError(f"the effect counter's JSON has nothing at {path!r}")
    if isinstance(value, list):
        return float(len(value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EffectCounterError(f"the effect counter gave {value!r}, not a number")
    return float(value)
