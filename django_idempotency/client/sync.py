"""The synchronous client: :class:`IdempotentClient`, over ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from django_idempotency.client.backoff import Backoff
from django_idempotency.client.errors import AttemptEvent, RetryAfter
from django_idempotency.client.keystore import KeyStore
from django_idempotency.client.policy import ClientBase, Headers, refuse_client_key


class IdempotentClient(ClientBase):
    """A synchronous HTTP client that sends every unsafe request with a stable key.

    Args:
        base_url: the API's root, e.g. ``"https://api.example.com"``.
        headers: sent with every request (e.g. ``{"Authorization": "Token ..."}``);
            never an ``Idempotency-Key``, which names one operation.
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
        ValueError: ``attempts`` is below 1, or ``headers`` (or ``http_client``'s
            headers) hold an ``Idempotency-Key``.
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
        refuse_client_key(headers if http_client is None else http_client.headers)
        self._owns_client = http_client is None
        self.http = http_client or httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
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
            headers: extra headers for this request (a mapping, ``httpx.Headers`` or
                ``(name, value)`` pairs). An ``Idempotency-Key`` among them, in any
                spelling, is the key (as ``key=``), sent once under that name.
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
            TypeError: two of ``operation``, ``key`` and an ``Idempotency-Key`` in
                ``headers`` were given (the same key twice is accepted).
            ValueError: ``headers`` holds more than one ``Idempotency-Key``.
        """
        key, all_headers = self._key(operation, key, headers)
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
        except RetryAfter as retry:
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
