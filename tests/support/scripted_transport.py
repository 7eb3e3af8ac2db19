"""An ``httpx.MockTransport`` answering from a script, and a client on it."""

from __future__ import annotations

from typing import Any

import httpx

from django_idempotency.client import AttemptEvent, Backoff, IdempotentClient

NO_JITTER = Backoff(initial=0.1, maximum=5.0, random=lambda: 0.5)


class Script:
    """A MockTransport handler answering from a list; records every request it saw."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def keys(self) -> list[str | None]:
        return [r.headers.get("Idempotency-Key") for r in self.requests]


def make_client(
    script: Script, events: list[AttemptEvent] | None = None, **kwargs: Any
) -> IdempotentClient:
    kwargs.setdefault("backoff", NO_JITTER)
    return IdempotentClient(
        "http://api.test",
        headers={"Authorization": "Token t"},
        transport=httpx.MockTransport(script),
        on_attempt=None if events is None else events.append,
        **kwargs,
    )
