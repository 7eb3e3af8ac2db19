"""The asyncio (or trio) client: :class:`AsyncIdempotentClient`, over ``httpx.AsyncClient``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from django_idempotency.client.backoff import Backoff
from django_idempotency.client.errors import AttemptEvent, RetryAfter
from django_idempotency.client.keystore import KeyStore
from django_idempotency.client.policy import ClientBase, Headers, refuse_client_key


class AsyncIdempotentClient(ClientBase):
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
        refuse_client_key(headers if http_client is None else http_client.headers)
        self._owns_client = http_client is None
        self.http = http_client or httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
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
        key, all_headers = self._key(operation, key, headers)
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
        except RetryAfter as retry:
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
