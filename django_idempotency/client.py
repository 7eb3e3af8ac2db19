"""The client side: send a mutating request with an ``Idempotency-Key`` and retry it safely.

Built on httpx (HTTP) and stamina (the retry loop); install them with the extra::

    pip install "django-idempotency[client]"

One *logical operation* gets one key, minted before its first attempt and sent on
every retry. The client retries network errors, 5xx answers (but 501 and 505) and the
409s that mean "retry me" (problem types ``request-in-flight`` and ``lease-lost``),
with exponential backoff and full jitter, never sooner than ``Retry-After``. It never
retries any other 4xx (422 above all: the key was reused for another request). A
replay (``Idempotent-Replayed: true``) is a success like the first answer. See
``docs/client.md``.

Usage::

    with IdempotentClient("https://api.example.com", headers={"Authorization": "..."}) as api:
        response = api.post("/v1/workers", json={"image": "ubuntu-24.04"},
                             operation="order-42/worker")
        worker = response.json()

This module needs no Django; ``django_idempotency`` itself imports without httpx.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

try:
    import httpx
    import stamina
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f"django_idempotency.client needs httpx and stamina ({exc.name} is missing). "
        "Install them with: pip install 'django-idempotency[client]'"
    ) from exc

from .client_store import KeyStore, MemoryKeyStore, SQLiteKeyStore, new_key

__all__ = [
    "RELEASED_4XX",
    "AsyncIdempotentClient",
    "AttemptEvent",
    "Backoff",
    "IdempotentClient",
    "IdempotentRequestError",
    "KeyStore",
    "MemoryKeyStore",
    "NonRetryableError",
    "ResponseNotReplayable",
    "RetriesExhausted",
    "SQLiteKeyStore",
    "is_replay",
    "problem_of",
    "problem_slug",
    "retry_after_seconds",
    "verdict",
]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
PROBLEM_JSON = "application/problem+json"
#: 409 problem types (suffixes of the ``type`` URI) that ask the client to retry.
RETRYABLE_CONFLICTS = ("request-in-flight", "lease-lost")
#: 5xx statuses that say "never" rather than "not now".
PERMANENT_5XX = frozenset({501, 505})
#: 4xx statuses on which django-idempotency releases the key (docs/protocol.md), so a retry with
#: the same key runs the view again. Not retried by default; opt in with
#: ``retry_statuses=RELEASED_4XX`` (Retry-After is honoured).
RELEASED_4XX = frozenset({408, 425, 429})
#: The problem type of a 410 that answers a retry of a completed operation whose
#: response was too large to store: done, but not replayable.
NOT_REPLAYABLE = "response-too-large-to-replay"

Verdict = Literal["success", "retry", "fail"]
Headers = Mapping[str, str]


# -- reading a response ------------------------------------------------------------------


def is_replay(response: httpx.Response) -> bool:
    """Whether ``response`` is a replay of a stored answer (``Idempotent-Replayed: true``)."""
    value: str = response.headers.get(REPLAYED_HEADER, "")
    return value.strip().lower() == "true"


def problem_of(response: httpx.Response) -> dict[str, Any] | None:
    """The RFC 9457 problem details of ``response``, or ``None`` if it carries none.

    Returns the parsed JSON object when the Content-Type is
    ``application/problem+json`` and the body is a JSON object; never raises.
    """
    if not response.headers.get("Content-Type", "").startswith(PROBLEM_JSON):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def problem_slug(response: httpx.Response) -> str:
    """The slug of ``response``'s problem ``type`` (``"lease-lost"``), ``""`` if none.

    The app's types are its ``PROBLEM_TYPE_BASE`` plus a slug, so the slug is what
    follows the last ``#``, ``/`` or ``:`` of the URI. A view's own problem types
    (``https://api.example.com/problems/name-taken``) have slugs of their own, so an
    answer of the view is never taken for one of the app's.
    """
    kind = str((problem_of(response) or {}).get("type", ""))
    return re.split(r"[#/:]", kind)[-1]


def retry_after_seconds(response: httpx.Response) -> float | None:
    """``Retry-After`` (RFC 9110 §10.2.3) in seconds from now, or ``None``.

    Accepts delay-seconds (``"2"``) and an HTTP-date; a date in the past gives 0.
    An unparseable value is ignored (``None``).
    """
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def verdict(response: httpx.Response, *, retry_statuses: frozenset[int] = frozenset()) -> Verdict:
    """What to do with ``response``: ``"success"``, ``"retry"`` or ``"fail"``.

    * below 400 (replays included): success;
    * 5xx but 501 and 505: retry (the server released the key, or never claimed it);
    * 409 with problem type ``request-in-flight`` or ``lease-lost``: retry (the same
      key is being processed, or the attempt was fenced off and rolled back);
    * a status in ``retry_statuses`` (opt-in, e.g. 429): retry;
    * anything else (400, 401, 404, 422, another 409, ...): fail, never retried.
    """
    status = response.status_code
    if status < 400:
        return "success"
    if status >= 500:
        return "fail" if status in PERMANENT_5XX else "retry"
    if status in retry_statuses:
        return "retry"
    if status == 409 and problem_slug(response) in RETRYABLE_CONFLICTS:
        return "retry"
    return "fail"


# -- backoff -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, floored by ``Retry-After``.

    The wait after attempt ``n`` (1-based) is ``uniform(0, min(maximum, initial *
    2 ** (n - 1)))`` seconds ("full jitter"), plus the server's ``Retry-After`` when
    it sent one (capped at ``max_retry_after``), so a retry never comes before the
    server asked and a crowd of clients told the same ``Retry-After`` spreads out.

    Attributes:
        initial: seconds; the ceiling of the first wait.
        maximum: seconds; the largest ceiling of the jitter.
        max_retry_after: seconds; a longer ``Retry-After`` is cut to this.
        random: returns a float in [0, 1); injectable for tests.
    """

    initial: float = 0.1
    maximum: float = 5.0
    max_retry_after: float = 60.0
    random: Callable[[], float] = random.random

    def ceiling(self, attempt: int) -> float:
        """The jitter's upper bound after attempt ``attempt`` (1-based), seconds."""
        try:
            return float(min(self.maximum, self.initial * 2 ** (attempt - 1)))
        except OverflowError:
            return self.maximum

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after attempt ``attempt`` before the next one."""
        jitter = self.random() * self.ceiling(attempt)
        if retry_after is None:
            return jitter
        return min(max(retry_after, 0.0), self.max_retry_after) + jitter


# -- events and errors -------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptEvent:
    """One attempt, as passed to the ``on_attempt`` callback.

    Attributes:
        operation: the caller's operation name (``None`` if the key was not stored).
        key: the idempotency key sent.
        number: 1 for the first attempt, 2 for the first retry, ...
        method: the HTTP method.
        url: the full URL.
        status: the HTTP status, or ``None`` when no response came (``error`` says why).
        error: the transport error (timeout, reset, refused), if any.
        replayed: the response was a replay.
        verdict: ``"success"``, ``"retry"`` or ``"fail"``.
        wait: seconds the client waits before the next attempt if it makes one
            (``None`` unless the verdict is ``"retry"``).
        elapsed: seconds this attempt took.
    """

    operation: str | None
    key: str
    number: int
    method: str
    url: str
    status: int | None
    error: Exception | None
    replayed: bool
    verdict: Verdict
    wait: float | None
    elapsed: float


class IdempotentRequestError(Exception):
    """The operation did not succeed. Base of the errors this client raises.

    Attributes:
        key: the idempotency key the attempts carried (retry later with it).
        operation: the operation name, if one was given.
        response: the last response received, or ``None`` (only network errors).
        attempts: how many attempts were made.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        operation: str | None,
        response: httpx.Response | None,
        attempts: int,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.operation = operation
        self.response = response
        self.attempts = attempts

    @property
    def status(self) -> int | None:
        """The last response's status, or ``None``."""
        return None if self.response is None else self.response.status_code

    @property
    def problem(self) -> dict[str, Any] | None:
        """The last response's problem+json body (``type``, ``title``, ``detail``)."""
        return None if self.response is None else problem_of(self.response)


class NonRetryableError(IdempotentRequestError):
    """The server gave a final answer that is not a success (4xx, 501, 505).

    Retrying with the same key would only get the same answer (a stored 4xx is
    replayed; a 422 means the key belongs to a different request). Fix the request
    and send it as a new operation (a new operation name or key).
    """


class ResponseNotReplayable(NonRetryableError):
    """The operation completed earlier, but its response was too large to be replayed.

    The server answered 410 ``response-too-large-to-replay``: the operation will not
    run again. ``original_status`` is the status it completed with; fetch the result
    another way (``response.headers["Location"]``, if the server sent one).
    """

    @property
    def original_status(self) -> int | None:
        """The status of the original response, from the problem's extension member."""
        value = (self.problem or {}).get("original_status")
        return value if isinstance(value, int) else None


class RetriesExhausted(IdempotentRequestError):
    """Every attempt failed with a retryable error and the attempts or time ran out.

    The operation may or may not have taken effect: retry it later with the same key
    (same operation name) to find out; its ``__cause__`` is the last network error.
    """


class _Retry(Exception):
    """Raised inside an attempt to tell stamina to retry after ``wait`` seconds."""

    def __init__(
        self, wait: float, response: httpx.Response | None, error: Exception | None
    ) -> None:
        super().__init__(f"retry in {wait:.3f} s")
        self.wait = wait
        self.response = response
        self.error = error


def _backoff_hook(exc: Exception) -> bool | float:
    """The ``on=`` hook of stamina: retry only our ``_Retry``, after the wait it computed."""
    return exc.wait if isinstance(exc, _Retry) else False


def _describe(method: str, url: str, response: httpx.Response) -> str:
    text = f"{method} {url}: {response.status_code} {response.reason_phrase}"
    problem = problem_of(response)
    if problem:
        kind = problem_slug(response)
        text += f" [{kind}] {problem.get('title', '')}: {problem.get('detail', '')}"
    return text


# -- the clients -------------------------------------------------------------------------


class _Base:
    """What the sync and async clients share: keys, decisions, events."""

    def __init__(
        self,
        *,
        attempts: int,
        total_timeout: float | None,
        backoff: Backoff | None,
        key_store: KeyStore | None,
        retry_statuses: frozenset[int] | set[int] | tuple[int, ...],
        on_attempt: Callable[[AttemptEvent], None] | None,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be 1 or more, not {attempts!r}")
        self.attempts = attempts
        self.total_timeout = total_timeout
        self.backoff = backoff or Backoff()
        self.keys: KeyStore = key_store if key_store is not None else MemoryKeyStore()
        self.retry_statuses = frozenset(retry_statuses)
        self.on_attempt = on_attempt

    def _key(self, operation: str | None, key: str | None) -> str:
        if key is not None and operation is not None:
            raise TypeError("pass operation= or key=, not both")
        if key is not None:
            return key
        if operation is not None:
            return self.keys.key_for(operation)
        return new_key()

    def _retry_context(self) -> Any:
        return stamina.retry_context(
            on=_backoff_hook,
            attempts=self.attempts,
            timeout=self.total_timeout,
            wait_initial=self.backoff.initial,
            wait_max=self.backoff.maximum,
            wait_jitter=0.0,
        )

    def _settle(
        self,
        *,
        operation: str | None,
        key: str,
        number: int,
        method: str,
        url: str,
        started: float,
        response: httpx.Response | None,
        error: Exception | None,
    ) -> httpx.Response:
        """Judge one attempt: return the response, or raise ``_Retry`` / a final error."""
        if response is None:
            outcome: Verdict = "retry"
            wait: float | None = self.backoff.wait(number)
        else:
            outcome = verdict(response, retry_statuses=self.retry_statuses)
            wait = None
            if outcome == "retry":
                wait = self.backoff.wait(number, retry_after_seconds(response))
        if self.on_attempt is not None:
            self.on_attempt(
                AttemptEvent(
                    operation=operation,
                    key=key,
                    number=number,
                    method=method,
                    url=url,
                    status=None if response is None else response.status_code,
                    error=error,
                    replayed=response is not None and is_replay(response),
                    verdict=outcome,
                    wait=wait,
                    elapsed=time.monotonic() - started,
                )
            )
        if outcome == "success":
            assert response is not None
            return response
        if outcome == "fail":
            assert response is not None
            not_replayable = problem_slug(response) == NOT_REPLAYABLE
            final = ResponseNotReplayable if not_replayable else NonRetryableError
            raise final(
                _describe(method, url, response),
                key=key,
                operation=operation,
                response=response,
                attempts=number,
            )
        assert wait is not None
        raise _Retry(wait, response, error)

    @staticmethod
    def _exhausted(
        retry: _Retry, method: str, url: str, key: str, operation: str | None, attempts: int
    ) -> RetriesExhausted:
        if retry.response is not None:
            last = _describe(method, url, retry.response)
        else:
            last = f"{method} {url}: {type(retry.error).__name__}: {retry.error}"
        return RetriesExhausted(
            f"gave up after {attempts} attempt(s); the last: {last}. The operation may "
            f"have taken effect: retry later with the same key ({key}).",
            key=key,
            operation=operation,
            response=retry.response,
            attempts=attempts,
        )


class IdempotentClient(_Base):
    """A synchronous HTTP client that sends every unsafe request with a stable key.

    Args:
        base_url: the API's root, e.g. ``"https://api.example.com"``.
        headers: sent with every request (e.g. ``{"Authorization": "Token ..."}``).
        attempts: most attempts per operation, the first included (default 6).
        timeout: seconds for one attempt (connect, read, write each); an attempt
            that times out is retried with the same key.
        total_timeout: seconds after which no new attempt starts (``None``: no limit).
        backoff: the wait between attempts (default :class:`Backoff`).
        key_store: where operation names map to keys (default: in memory; pass a
            :class:`SQLiteKeyStore` to survive restarts).
        retry_statuses: extra 4xx statuses to retry (e.g. ``{429}``); empty by default.
        on_attempt: called after every attempt with an :class:`AttemptEvent` (for
            logs and metrics); it runs in the calling thread.
        transport: an httpx transport (tests: ``httpx.MockTransport``).
        http_client: an ``httpx.Client`` to use instead of creating one (then
            ``base_url``, ``headers``, ``timeout`` and ``transport`` are ignored, and
            closing this client does not close it).

    Raises:
        ValueError: ``attempts`` is below 1.
    """

    def __init__(
        self,
        base_url: str = "",
        *,
        headers: Headers | None = None,
        attempts: int = 6,
        timeout: float = 10.0,
        total_timeout: float | None = 60.0,
        backoff: Backoff | None = None,
        key_store: KeyStore | None = None,
        retry_statuses: frozenset[int] | set[int] | tuple[int, ...] = frozenset(),
        on_attempt: Callable[[AttemptEvent], None] | None = None,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            attempts=attempts,
            total_timeout=total_timeout,
            backoff=backoff,
            key_store=key_store,
            retry_statuses=retry_statuses,
            on_attempt=on_attempt,
        )
        self._owns_client = http_client is None
        self.http = http_client or httpx.Client(
            base_url=base_url, headers=dict(headers or {}), timeout=timeout, transport=transport
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | str | None = None,
        params: Mapping[str, str] | None = None,
        headers: Headers | None = None,
        operation: str | None = None,
        key: str | None = None,
    ) -> httpx.Response:
        """Send ``method path`` until it succeeds, fails for good, or retries run out.

        Args:
            method: ``"POST"``, ``"PUT"``, ``"PATCH"`` or ``"DELETE"`` (any works).
            path: relative to ``base_url`` (or a full URL).
            json: a JSON body (encoded the same way on every attempt).
            content: a raw body (bytes or str; not an iterator: it is sent again).
            params: query parameters.
            headers: extra headers for this request.
            operation: names the logical operation; its key comes from the key store,
                so a later call (even from a restarted process, with a persistent
                store) with the same name reuses it.
            key: an explicit key instead (not with ``operation``). Neither: a fresh
                key for this call, kept across its retries.

        Returns:
            The final response: 1xx-3xx, a replay included (see :func:`is_replay`).

        Raises:
            NonRetryableError: a 4xx (or 501/505) answer; ``.problem`` holds its
                problem+json.
            RetriesExhausted: the attempts or ``total_timeout`` ran out on retryable
                errors.
            TypeError: both ``operation`` and ``key`` were given.
        """
        key = self._key(operation, key)
        all_headers = {**(headers or {}), HEADER: key}
        url = str(self.http.build_request(method, path, params=params).url)
        number = 0
        try:
            for attempt in self._retry_context():
                with attempt:
                    number = attempt.num
                    started = time.monotonic()
                    response: httpx.Response | None = None
                    error: Exception | None = None
                    try:
                        response = self.http.request(
                            method,
                            path,
                            json=json,
                            content=content,
                            params=params,
                            headers=all_headers,
                        )
                    except httpx.TransportError as exc:
                        error = exc
                    return self._settle(
                        operation=operation,
                        key=key,
                        number=number,
                        method=method,
                        url=url,
                        started=started,
                        response=response,
                        error=error,
                    )
        except _Retry as retry:
            raise self._exhausted(retry, method, url, key, operation, number) from retry.error
        raise AssertionError("unreachable: stamina yields at least one attempt")

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """``request("POST", path, ...)``."""
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        """``request("PUT", path, ...)``."""
        return self.request("PUT", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        """``request("PATCH", path, ...)``."""
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        """``request("DELETE", path, ...)``."""
        return self.request("DELETE", path, **kwargs)

    def close(self) -> None:
        """Close the underlying ``httpx.Client`` (if this client created it)."""
        if self._owns_client:
            self.http.close()

    def __enter__(self) -> IdempotentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncIdempotentClient(_Base):
    """The asyncio (or trio) twin of :class:`IdempotentClient`; same arguments.

    ``http_client`` is an ``httpx.AsyncClient`` and ``transport`` an
    ``httpx.AsyncBaseTransport``. The key store is called directly (a local file
    write for :class:`SQLiteKeyStore`, a few milliseconds at most).
    """

    def __init__(
        self,
        base_url: str = "",
        *,
        headers: Headers | None = None,
        attempts: int = 6,
        timeout: float = 10.0,
        total_timeout: float | None = 60.0,
        backoff: Backoff | None = None,
        key_store: KeyStore | None = None,
        retry_statuses: frozenset[int] | set[int] | tuple[int, ...] = frozenset(),
        on_attempt: Callable[[AttemptEvent], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            attempts=attempts,
            total_timeout=total_timeout,
            backoff=backoff,
            key_store=key_store,
            retry_statuses=retry_statuses,
            on_attempt=on_attempt,
        )
        self._owns_client = http_client is None
        self.http = http_client or httpx.AsyncClient(
            base_url=base_url, headers=dict(headers or {}), timeout=timeout, transport=transport
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | str | None = None,
        params: Mapping[str, str] | None = None,
        headers: Headers | None = None,
        operation: str | None = None,
        key: str | None = None,
    ) -> httpx.Response:
        """Async :meth:`IdempotentClient.request`: same arguments, result and errors."""
        key = self._key(operation, key)
        all_headers = {**(headers or {}), HEADER: key}
        url = str(self.http.build_request(method, path, params=params).url)
        number = 0
        try:
            async for attempt in self._retry_context():
                with attempt:
                    number = attempt.num
                    started = time.monotonic()
                    response: httpx.Response | None = None
                    error: Exception | None = None
                    try:
                        response = await self.http.request(
                            method,
                            path,
                            json=json,
                            content=content,
                            params=params,
                            headers=all_headers,
                        )
                    except httpx.TransportError as exc:
                        error = exc
                    return self._settle(
                        operation=operation,
                        key=key,
                        number=number,
                        method=method,
                        url=url,
                        started=started,
                        response=response,
                        error=error,
                    )
        except _Retry as retry:
            raise self._exhausted(retry, method, url, key, operation, number) from retry.error
        raise AssertionError("unreachable: stamina yields at least one attempt")

    async def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """``await request("POST", path, ...)``."""
        return await self.request("POST", path, **kwargs)

    async def put(self, path: str, **kwargs: Any) -> httpx.Response:
        """``await request("PUT", path, ...)``."""
        return await self.request("PUT", path, **kwargs)

    async def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        """``await request("PATCH", path, ...)``."""
        return await self.request("PATCH", path, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        """``await request("DELETE", path, ...)``."""
        return await self.request("DELETE", path, **kwargs)

    async def aclose(self) -> None:
        """Close the underlying ``httpx.AsyncClient`` (if this client created it)."""
        if self._owns_client:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncIdempotentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
