"""Which response headers are stored and replayed, and how a replay is built (SPEC §2).

Stored and replayed: ``Content-Type``, ``Location``, ``ETag``, ``Last-Modified``,
``Link``, ``Content-Language``, plus the configured extras. Never stored, even when
configured: credentials and cookies, hop-by-hop headers (RFC 9110 §7.6.1) and
per-request tracing headers. Every replay carries ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable

from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.http.response import HttpResponseBase

from .store import StoredResponse

REPLAYED_HEADER = "Idempotent-Replayed"

STANDARD_REPLAY_HEADERS = frozenset(
    {"content-type", "location", "etag", "last-modified", "link", "content-language"}
)

#: Never stored or replayed, whatever the configuration says.
FORBIDDEN_HEADERS = frozenset(
    {
        # credentials and state
        "set-cookie",
        "cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        # hop-by-hop (RFC 9110 §7.6.1) and framing
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        # per-request tracing and timing
        "traceparent",
        "tracestate",
        "baggage",
        "x-request-id",
        "x-correlation-id",
        "request-id",
        "x-amzn-trace-id",
        "x-cloud-trace-context",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-parentspanid",
        "x-b3-sampled",
        "x-b3-flags",
        "b3",
        "server-timing",
        "date",
        # our own marker
        REPLAYED_HEADER.lower(),
    }
)


def replayable_names(extra: Iterable[str]) -> frozenset[str]:
    """Lower-case names of the headers stored for replay: standard plus ``extra``."""
    return (STANDARD_REPLAY_HEADERS | {name.lower() for name in extra}) - FORBIDDEN_HEADERS


async def _collect(parts: AsyncIterable[bytes]) -> bytes:
    return b"".join([part async for part in parts])


def response_body(response: HttpResponseBase) -> bytes:
    """The full body of ``response`` as bytes; a streaming body is consumed.

    An async streaming body (an async view's ``StreamingHttpResponse`` over an async
    iterator) is consumed on the event loop through ``async_to_sync``.
    """
    if getattr(response, "streaming", False):
        if getattr(response, "is_async", False):
            return async_to_sync(_collect)(response.streaming_content)  # type: ignore[attr-defined]
        return b"".join(response.streaming_content)  # type: ignore[attr-defined]
    return bytes(response.content)  # type: ignore[attr-defined]


def snapshot(response: HttpResponseBase, extra_headers: Iterable[str]) -> StoredResponse:
    """What to store of ``response``: status, allowlisted headers, body bytes.

    A streaming response is consumed; pass the result to :func:`build` to answer
    with it (the original's iterator is spent).
    """
    allowed = replayable_names(extra_headers)
    headers = [(name, value) for name, value in response.items() if name.lower() in allowed]
    return StoredResponse(response.status_code, headers, response_body(response))


def rebuild_consumed(original: HttpResponseBase, stored: StoredResponse) -> HttpResponse:
    """A plain response with ``stored``'s body, for a streaming ``original`` we consumed.

    The original's resource closers (open files of a ``FileResponse``) move to the new
    response, so Django closes them when it closes the response it sends.
    """
    response = build(stored, replayed=False)
    for name, value in original.items():
        if name.lower() not in {n.lower() for n, _ in stored.headers}:
            response[name] = value
    for cookie in original.cookies.values():
        response.cookies[cookie.key] = cookie
    closers = getattr(original, "_resource_closers", None)
    if closers is not None:
        response._resource_closers.extend(closers)  # type: ignore[attr-defined]
        closers.clear()
    return response


def build(stored: StoredResponse, *, replayed: bool) -> HttpResponse:
    """Turn a stored response back into an ``HttpResponse``.

    Args:
        stored: status, headers and body bytes.
        replayed: add ``Idempotent-Replayed: true`` (a replay) or not (the first
            answer rebuilt from a consumed streaming response).
    """
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]
    for name, value in stored.headers:
        response[name] = value
    if replayed:
        response[REPLAYED_HEADER] = "true"
    return response
