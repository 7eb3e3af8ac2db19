"""The client's retries say what is retried; stamina prints no bare line for them.

One INFO line per retry scheduled on ``django_idempotency.client`` (method, URL with
its query values and credentials left out, attempt, wait, reason, key hash), one
WARNING line when the client gives up; stamina's own hooks skip the client's retries
and still see every other retry of the process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
import stamina
from stamina.instrumentation import RetryDetails, get_on_retry_hooks, set_on_retry_hooks

from django_idempotency.client import IdempotentClient, RetriesExhausted, logs
from tests.support.scripted_transport import NO_JITTER, Script

PROBLEM = {"Content-Type": "application/problem+json"}
IN_FLIGHT = {"type": "tag:x#request-in-flight", "title": "t", "status": 409}


@pytest.fixture(autouse=True)
def fresh_stamina_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """stamina's default hooks, as in a new process where no client was made yet."""
    monkeypatch.setattr(logs, "_quieted", [])
    set_on_retry_hooks(None)
    with stamina.set_testing(True, attempts=1000, cap=True):
        yield
    set_on_retry_hooks(None)


def client(script: Script, **kwargs: object) -> IdempotentClient:
    return IdempotentClient(
        "https://user:secret@api.test",
        transport=httpx.MockTransport(script),
        backoff=NO_JITTER,
        **kwargs,  # type: ignore[arg-type]
    )


def test_each_retry_logs_the_request_attempt_wait_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(
        httpx.Response(409, headers=PROBLEM, json=IN_FLIGHT),
        httpx.ConnectError("refused"),
        httpx.Response(502),
        httpx.Response(201),
    )
    caplog.set_level(logging.INFO)

    with client(script) as api:
        api.post("/v1/workers", params={"token": "t0ps3cret", "page": "2"}, key="K-1")

    lines = [r for r in caplog.records if r.name == "django_idempotency.client"]
    assert [r.getMessage() for r in lines] == [
        "idempotency client retry_scheduled: POST https://api.test/v1/workers?token=...&page=..."
        f" attempt={n} wait={wait} reason={why} key={logs.key_hash('K-1')}"
        for n, wait, why in [
            (1, "0.05s", "409 request-in-flight"),
            (2, "0.10s", "ConnectError"),
            (3, "0.20s", "502 Bad Gateway"),
        ]
    ]
    assert all(r.levelno == logging.INFO and r.event == "retry_scheduled" for r in lines)
    assert [(r.method, r.attempt, r.wait) for r in lines] == [
        ("POST", 1, pytest.approx(0.05)),
        ("POST", 2, pytest.approx(0.1)),
        ("POST", 3, pytest.approx(0.2)),
    ]
    assert not any("t0ps3cret" in r.getMessage() or "secret@" in r.getMessage() for r in lines)
    assert not [r for r in caplog.records if r.name.startswith("stamina")]


def test_giving_up_logs_a_warning_and_no_retry_after_the_last_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(httpx.Response(503))
    caplog.set_level(logging.INFO)

    with client(script, attempts=2) as api, pytest.raises(RetriesExhausted):
        api.post("/v1/workers", key="K-2")

    lines = [(r.levelname, r.event, r.attempt) for r in caplog.records if r.name.endswith("client")]
    assert lines == [("INFO", "retry_scheduled", 1), ("WARNING", "gave_up", 2)]
    assert not [r for r in caplog.records if r.name.startswith("stamina")]


def test_stamina_hooks_still_see_every_other_retry() -> None:
    seen: list[RetryDetails] = []
    set_on_retry_hooks([seen.append])
    script = Script(httpx.Response(503), httpx.Response(201))

    with client(script) as api:
        api.post("/v1/workers")
    for attempt in stamina.retry_context(on=ValueError, attempts=2):
        with attempt:
            if attempt.num == 1:
                raise ValueError("the application's own retry")

    assert [str(details.caused_by) for details in seen] == ["the application's own retry"]
    assert len(script.requests) == 2
    assert all(isinstance(hook, logs.SkipClientRetries) for hook in get_on_retry_hooks())


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        ("https://api.test/v1/w", "https://api.test/v1/w"),
        (
            "https://u:p@api.test:8443/v1/w?a=1&a=2&b=",
            "https://api.test:8443/v1/w?a=...&a=...&b=...",
        ),
        ("http://api.test/v1/w#frag", "http://api.test/v1/w"),
    ],
)
def test_a_logged_url_holds_no_credentials_nor_query_values(url: str, logged: str) -> None:
    assert logs.loggable_url(url) == logged
