"""Async function views under the ASGI handler: concurrent duplicates (docs/protocol.md).

Requests go through Django's real ``ASGIHandler`` (via httpx's ASGI transport), which
gives each request its own thread-sensitive context, as uvicorn/daphne would: the
protocol of each request runs in a worker thread of its own, with its own database
connection, while the view coroutines share the event loop.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

#: asyncio events a test sets up so the view waits mid-flight (no sleeps).
HOLD: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


def tenant(request: HttpRequest) -> str:
    return "tenant:async-tests"


@idempotent(principal=tenant)
async def create(request: HttpRequest) -> HttpResponse:
    widget = await Widget.objects.acreate(name=request.headers.get("X-Name", "async"))
    hold = HOLD.get(request.headers.get("X-Hold", ""))
    if hold is not None:
        entered, opened = hold
        entered.set()
        await asyncio.wait_for(opened.wait(), 30)
    return JsonResponse({"id": widget.pk}, status=201)


@idempotent(principal=tenant)
async def fail(request: HttpRequest) -> HttpResponse:
    await Widget.objects.acreate(name="fail")
    return JsonResponse({"detail": "busy"}, status=503)


@idempotent(principal=tenant)
async def stream(request: HttpRequest) -> StreamingHttpResponse:
    await Widget.objects.acreate(name="stream")

    async def parts():
        yield b"part1,"
        yield b"part2"

    return StreamingHttpResponse(parts(), content_type="text/plain")


urlpatterns = [path("create", create), path("fail", fail), path("stream", stream)]


def client() -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=ASGIHandler())
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


def post(http: httpx.AsyncClient, url: str, key: str, **headers: str):
    return http.post(url, content=b"{}", headers={"Idempotency-Key": key, **headers})


def test_concurrent_duplicates_execute_once():
    key = str(uuid.uuid4())

    async def scenario() -> list[httpx.Response]:
        async with client() as http:
            return list(await asyncio.gather(*(post(http, "/create", key) for _ in range(6))))

    responses = asyncio.run(scenario())
    assert Widget.objects.count() == 1
    executed = [
        r for r in responses if r.status_code == 201 and "idempotent-replayed" not in r.headers
    ]
    replayed = [r for r in responses if r.headers.get("idempotent-replayed") == "true"]
    in_flight = [r for r in responses if r.status_code == 409]
    assert len(executed) == 1
    assert len(executed) + len(replayed) + len(in_flight) == 6
    assert all(r.content == executed[0].content for r in replayed)
    assert all(r.headers["content-type"] == "application/problem+json" for r in in_flight)
    record = IdempotencyRecord.objects.get()
    assert record.state == RecordState.COMPLETED and record.response_status == 201


@pytest.mark.postgres
def test_duplicate_while_the_original_awaits_gets_409_then_replays():
    key = str(uuid.uuid4())

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        entered, opened = asyncio.Event(), asyncio.Event()
        HOLD["first"] = (entered, opened)
        try:
            async with client() as http:
                first = asyncio.create_task(post(http, "/create", key, **{"X-Hold": "first"}))
                await asyncio.wait_for(entered.wait(), 30)
                # The original is suspended in its view, on the same event loop, with its
                # claim committed and its transaction open in its own worker thread.
                duplicate = await post(http, "/create", key)
                opened.set()
                original = await first
                replay = await post(http, "/create", key)
                return original, duplicate, replay
        finally:
            del HOLD["first"]

    original, duplicate, replay = asyncio.run(scenario())
    assert original.status_code == 201
    assert duplicate.status_code == 409 and "retry-after" in duplicate.headers
    assert json.loads(duplicate.content)["type"].endswith("request-in-flight")
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert replay.content == original.content
    assert Widget.objects.count() == 1


@pytest.mark.postgres
def test_other_keys_run_concurrently_with_a_suspended_view():
    """A suspended async view holds its worker thread, not the event loop."""
    held = str(uuid.uuid4())

    async def scenario() -> list[int]:
        entered, opened = asyncio.Event(), asyncio.Event()
        HOLD["other"] = (entered, opened)
        try:
            async with client() as http:
                first = asyncio.create_task(post(http, "/create", held, **{"X-Hold": "other"}))
                await asyncio.wait_for(entered.wait(), 30)
                others = await asyncio.gather(
                    *(post(http, "/create", str(uuid.uuid4())) for _ in range(3))
                )
                opened.set()
                return [(await first).status_code, *(r.status_code for r in others)]
        finally:
            del HOLD["other"]

    assert asyncio.run(scenario()) == [201, 201, 201, 201]
    assert Widget.objects.count() == 4


def test_release_rolls_back_the_async_views_writes():
    key = str(uuid.uuid4())

    async def scenario() -> list[int]:
        async with client() as http:
            return [(await post(http, "/fail", key)).status_code for _ in range(2)]

    assert asyncio.run(scenario()) == [503, 503]  # released: the retry runs again
    assert Widget.objects.filter(name="fail").count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_async_streaming_response_is_stored_and_replayed():
    key = str(uuid.uuid4())

    async def scenario() -> list[httpx.Response]:
        async with client() as http:
            return [await post(http, "/stream", key) for _ in range(2)]

    first, again = asyncio.run(scenario())
    assert first.status_code == 200 and first.content == b"part1,part2"
    assert again.headers["idempotent-replayed"] == "true" and again.content == b"part1,part2"
    assert again.headers["content-type"] == "text/plain"
    assert Widget.objects.filter(name="stream").count() == 1
