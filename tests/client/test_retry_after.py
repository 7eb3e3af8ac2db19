"""What the client reads from an answer's headers never raises, and valid values count.

``Retry-After`` (RFC 9110 §10.2.3) is delay-seconds (ASCII digits) or an HTTP-date; the
client waits at least that long, capped by ``Backoff.max_retry_after``, and ignores a
value it cannot read (the wait is then its backoff alone).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
from collections.abc import Iterator

import httpx
import pytest
import stamina
import time_machine

from django_idempotency.client import (
    AsyncIdempotentClient,
    AttemptEvent,
    NonRetryableError,
    is_replay,
    problem_of,
    retry_after_seconds,
)
from tests.support.scripted_transport import NO_JITTER, Script, make_client

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
PROBLEM = {"Content-Type": "application/problem+json"}


@pytest.fixture(autouse=True)
def no_waits() -> Iterator[None]:
    with stamina.set_testing(True, attempts=1000, cap=True):
        yield


def answer(value: str | bytes, status: int = 503) -> httpx.Response:
    raw = value if isinstance(value, bytes) else value.encode("utf-8")
    return httpx.Response(status, headers=[(b"Retry-After", raw)])


MALFORMED = [
    "²",  # a digit to str.isdigit, not to float
    "٣",  # an Arabic-Indic digit
    "-1",
    "1.5",
    "1e3",
    "0x10",
    "1, 2",  # two values
    "soon",
    "Mon, 01 Jan 99999 00:00:00 GMT",  # a year out of range
    "Sun, 06 Nov 1994 25:49:37 GMT",  # an hour out of range
    "Sun, 06 Nov 1994 08:49:37 +9999",  # a zone out of range
]


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_retry_after_is_ignored(value: str) -> None:
    assert retry_after_seconds(answer(value)) is None


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_retry_after_never_raises_out_of_post_and_the_backoff_applies(
    value: str,
) -> None:
    script = Script(answer(value), httpx.Response(201))
    events: list[AttemptEvent] = []

    with make_client(script, events) as client:
        assert client.post("/x", json={}).status_code == 201

    assert events[0].verdict == "retry" and events[0].wait == pytest.approx(0.05)  # jitter


@pytest.mark.parametrize("value", MALFORMED[:3])
def test_the_async_client_ignores_a_malformed_retry_after(value: str) -> None:
    script = Script(answer(value, 429), httpx.Response(201))

    async def run() -> int:
        async with AsyncIdempotentClient(
            "http://api.test",
            transport=httpx.MockTransport(script),
            backoff=NO_JITTER,
            retry_statuses={429},
        ) as client:
            return (await client.post("/x")).status_code

    assert asyncio.run(run()) == 201


@time_machine.travel(NOW, tick=False)
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("Sun, 01 Mar 2026 12:00:30 GMT", 30.0),  # IMF-fixdate
        ("Sunday, 01-Mar-26 12:00:30 GMT", 30.0),  # RFC 850 (obsolete, still accepted)
        ("Sun Mar  1 12:00:30 2026", 30.0),  # asctime (obsolete, still accepted)
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past
    ],
)
def test_a_valid_retry_after_is_read_in_seconds_from_now(value: str, seconds: float) -> None:
    assert retry_after_seconds(answer(value)) == seconds


@time_machine.travel(NOW, tick=False)
def test_a_valid_retry_after_is_a_floor_capped_by_max_retry_after() -> None:
    date = email.utils.format_datetime(NOW + dt.timedelta(seconds=20), usegmt=True)
    script = Script(answer("3"), answer(date), answer("9" * 400), httpx.Response(201))
    events: list[AttemptEvent] = []

    with make_client(script, events) as client:
        client.post("/x")

    # Retry-After plus full jitter (0.5 of 0.1, 0.2, 0.4 s); 60 s at most (the default cap).
    assert [e.wait for e in events[:3]] == [
        pytest.approx(3.05),
        pytest.approx(20.1),
        pytest.approx(60.2),
    ]


def test_a_problem_body_too_deeply_nested_to_parse_is_no_problem_and_no_error() -> None:
    deep = httpx.Response(409, headers=PROBLEM, content=b"[" * 200_000)
    undecodable = httpx.Response(409, headers=PROBLEM, content=b"\xff\xfe{")
    script = Script(deep, httpx.Response(201, headers={"Idempotent-Replayed": "true"}))

    assert problem_of(deep) is None and problem_of(undecodable) is None
    with make_client(script) as client, pytest.raises(NonRetryableError, match="409") as failure:
        client.post("/x")
    assert failure.value.problem is None
    assert not is_replay(deep)
