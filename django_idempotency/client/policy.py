"""What the sync and async clients share: keys, the verdict on each attempt, events.

The clients differ only in how they send a request (``httpx.Client`` or
``httpx.AsyncClient``); everything they decide is here, in plain synchronous code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import httpx
import stamina

from django_idempotency.client import logs
from django_idempotency.client.backoff import Backoff
from django_idempotency.client.errors import (
    AttemptEvent,
    NonRetryableError,
    ResponseNotReplayable,
    RetriesExhausted,
    RetryAfter,
    describe,
)
from django_idempotency.client.keystore import KeyStore, MemoryKeyStore, new_key
from django_idempotency.client.responses import (
    HEADER,
    NOT_REPLAYABLE,
    Verdict,
    is_replay,
    problem_slug,
    retry_after_seconds,
    verdict,
)

#: Request headers as httpx takes them: a mapping, an ``httpx.Headers`` or
#: ``(name, value)`` pairs.
Headers: TypeAlias = Mapping[str, str] | httpx.Headers | Sequence[tuple[str, str]]


def caller_key(headers: Headers | None) -> str | None:
    """The ``Idempotency-Key`` the caller put in ``headers`` (any spelling), or ``None``.

    Raises:
        ValueError: ``headers`` holds more than one ``Idempotency-Key`` (two
            spellings, or a repeated pair): one request has one key.
    """
    values = httpx.Headers(headers).get_list(HEADER)
    if len(values) > 1:
        raise ValueError(
            f"headers= holds {len(values)} {HEADER} values; one request carries one key"
        )
    return values[0] if values else None


def refuse_client_key(headers: Headers | None) -> None:
    """Refuse an ``Idempotency-Key`` among a client's default headers.

    Raises:
        ValueError: the default headers hold one: every operation would share it.
    """
    if HEADER in httpx.Headers(headers):
        raise ValueError(
            f"the client's headers= holds an {HEADER}, which every request would share; "
            "a key names one operation: pass key= (or operation=, or headers=) per request"
        )


def _backoff_hook(exc: Exception) -> bool | float:
    """The ``on=`` hook of stamina: retry only our ``RetryAfter``, after the wait it computed."""
    return exc.wait if isinstance(exc, RetryAfter) else False


class ClientBase:
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
        logs.quiet_stamina()  # the client logs its own retries (client.logs)

    def _key(
        self, operation: str | None, key: str | None, headers: Headers | None
    ) -> tuple[str, httpx.Headers]:
        """The request's key and the headers that carry it, once.

        The key is ``key=``, the one in ``headers=`` (any spelling), the key store's
        for ``operation=``, or a new one. Raises ``TypeError`` when two of them name
        different keys, ``ValueError`` when ``headers=`` holds several.
        """
        own = caller_key(headers)
        if own is not None and operation is not None:
            raise TypeError(
                f"pass operation= or an {HEADER} in headers=, not both (the operation's "
                "key comes from the key store)"
            )
        if own is not None and key is not None and own != key:
            raise TypeError(f"key= and the {HEADER} in headers= differ; pass one key")
        if key is not None and operation is not None:
            raise TypeError("pass operation= or key=, not both")
        if key is None:
            key = own
        if key is None:
            key = new_key() if operation is None else self.keys.key_for(operation)
        sent = httpx.Headers(headers)
        sent[HEADER] = key  # replaces the caller's spelling: one header, one key
        return key, sent

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
        """Judge one attempt: return the response, or raise ``RetryAfter`` / a final error."""
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
                describe(method, url, response),
                key=key,
                operation=operation,
                response=response,
                attempts=number,
            )
        assert wait is not None
        if number < self.attempts:
            logs.retry_scheduled(
                method=method,
                url=url,
                key=key,
                attempt=number,
                wait=wait,
                response=response,
                error=error,
            )
        raise RetryAfter(wait, response, error)

    @staticmethod
    def _exhausted(
        retry: RetryAfter, method: str, url: str, key: str, operation: str | None, attempts: int
    ) -> RetriesExhausted:
        logs.gave_up(
            method=method,
            url=url,
            key=key,
            attempt=attempts,
            response=retry.response,
            error=retry.error,
        )
        if retry.response is not None:
            last = describe(method, url, retry.response)
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
