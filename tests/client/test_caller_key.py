"""A key the caller puts in ``headers=`` is the request's key: sent once, never replaced."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import stamina

from django_idempotency.client import AsyncIdempotentClient, IdempotentClient
from tests.support.scripted_transport import NO_JITTER, Script, make_client


@pytest.fixture(autouse=True)
def no_waits() -> Iterator[None]:
    with stamina.set_testing(True, attempts=1000, cap=True):
        yield


def key_headers(request: httpx.Request) -> list[tuple[str, str]]:
    """Every ``Idempotency-Key`` the server received, as sent."""
    return [(n, v) for n, v in request.headers.multi_items() if n.lower() == "idempotency-key"]


CALLER_HEADERS = [
    pytest.param({"Idempotency-Key": "K-1"}, id="dict"),
    pytest.param({"idempotency-key": "K-1"}, id="lower-case"),
    pytest.param({"IDEMPOTENCY-KEY": "K-1", "X-Trace": "t"}, id="upper-case"),
    pytest.param(httpx.Headers({"Idempotency-key": "K-1"}), id="httpx-headers"),
    pytest.param([("idempotency-Key", "K-1"), ("X-Trace", "t")], id="pairs"),
]


@pytest.mark.parametrize("headers", CALLER_HEADERS)
def test_a_key_in_headers_is_the_key_sent_once_on_every_attempt(headers: Any) -> None:
    script = Script(httpx.Response(503), httpx.ConnectError("refused"), httpx.Response(201))

    with make_client(script) as client:
        assert client.post("/x", json={}, headers=headers).status_code == 201

    assert [key_headers(r) for r in script.requests] == [[("idempotency-key", "K-1")]] * 3


@pytest.mark.parametrize("headers", CALLER_HEADERS)
def test_the_async_client_sends_a_key_in_headers_once_as_the_key(headers: Any) -> None:
    script = Script(httpx.ReadTimeout("slow"), httpx.Response(201))

    async def run() -> None:
        async with AsyncIdempotentClient(
            "http://api.test", transport=httpx.MockTransport(script), backoff=NO_JITTER
        ) as client:
            await client.post("/x", json={}, headers=headers)

    asyncio.run(run())

    assert [key_headers(r) for r in script.requests] == [[("idempotency-key", "K-1")]] * 2


def test_a_key_in_headers_equal_to_key_is_accepted() -> None:
    script = Script(httpx.Response(201))

    with make_client(script) as client:
        client.post("/x", headers={"idempotency-key": "K-1"}, key="K-1")

    assert key_headers(script.requests[0]) == [("idempotency-key", "K-1")]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"key": "K-2"}, TypeError, "key= and the Idempotency-Key in headers= differ"),
        ({"operation": "op"}, TypeError, "pass operation= or an Idempotency-Key"),
    ],
    ids=["other-key", "operation"],
)
def test_a_key_in_headers_with_another_key_source_is_refused_before_sending(
    kwargs: dict[str, str], error: type[Exception], message: str
) -> None:
    script = Script(httpx.Response(201))

    with make_client(script) as client, pytest.raises(error, match=message):
        client.post("/x", headers={"Idempotency-Key": "K-1"}, **kwargs)

    assert script.requests == []


@pytest.mark.parametrize(
    "headers",
    [
        [("Idempotency-Key", "K-1"), ("idempotency-key", "K-2")],
        [("Idempotency-Key", "K-1"), ("Idempotency-Key", "K-1")],
    ],
    ids=["two-spellings", "repeated"],
)
def test_two_keys_in_headers_are_refused_before_sending(headers: Any) -> None:
    script = Script(httpx.Response(201))

    async def run() -> None:
        async with AsyncIdempotentClient(
            "http://api.test", transport=httpx.MockTransport(script)
        ) as client:
            await client.post("/x", headers=headers)

    with make_client(script) as client, pytest.raises(ValueError, match="2 Idempotency-Key"):
        client.post("/x", headers=headers)
    with pytest.raises(ValueError, match="2 Idempotency-Key"):
        asyncio.run(run())

    assert script.requests == []


@pytest.mark.parametrize(
    ("client_class", "http_class"),
    [(IdempotentClient, httpx.Client), (AsyncIdempotentClient, httpx.AsyncClient)],
    ids=["sync", "async"],
)
def test_a_key_among_the_clients_default_headers_is_refused(
    client_class: type[Any], http_class: type[Any]
) -> None:
    with pytest.raises(ValueError, match="which every request would share"):
        client_class("http://api.test", headers={"idempotency-key": "K-1"})
    with pytest.raises(ValueError, match="which every request would share"):
        client_class(http_client=http_class(headers={"Idempotency-Key": "K-1"}))
