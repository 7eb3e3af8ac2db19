"""What a client reports: one event per attempt, and the errors it raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from django_idempotency.client.responses import Verdict, problem_of, problem_slug


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


class RetryAfter(Exception):
    """Raised inside an attempt to tell stamina to retry after ``wait`` seconds."""

    def __init__(
        self, wait: float, response: httpx.Response | None, error: Exception | None
    ) -> None:
        super().__init__(f"retry in {wait:.3f} s")
        self.wait = wait
        self.response = response
        self.error = error


def _backoff_hook(exc: Exception) -> bool | float:
    """The ``on=`` hook of stamina: retry only our ``RetryAfter``, after the wait it computed."""
    return exc.wait if isinstance(exc, RetryAfter) else False


def describe(method: str, url: str, response: httpx.Response) -> str:
    """One line for an error message: the request, the status and the problem, if any."""
    text = f"{method} {url}: {response.status_code} {response.reason_phrase}"
    problem = problem_of(response)
    if problem:
        kind = problem_slug(response)
        text += f" [{kind}] {problem.get('title', '')}: {problem.get('detail', '')}"
    return text
