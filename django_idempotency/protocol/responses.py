"""Which response headers are stored and replayed, and how a replay is built.

A replay is the response the first execution produced (docs/protocol.md#replay): its
status, its body bytes and **every header it carried**, except a denylist of headers
that belong to one exchange rather than to the response:

* :data:`FORBIDDEN_HEADERS` (and :data:`FORBIDDEN_PREFIXES`): credentials and cookies,
  ``Date``, hop-by-hop and framing headers (RFC 9110 §7.6.1), per-request tracing and
  correlation ids. Never stored or replayed, whatever the configuration says.
  ``Content-Length`` is recomputed for the stored bytes.
* :data:`EXCHANGE_HEADERS` (and :data:`EXCHANGE_PREFIXES`): headers that describe the
  server or the moment of the exchange (``Server``, ``Via``, ``Age``, timings, CORS
  grants computed from the request's ``Origin``, rate-limit counters). Dropped by
  default; a name listed in ``REPLAY_HEADERS`` (or a view's ``replay_headers=``) is
  kept.
* ``REPLAY_DENY_HEADERS``: the project's own additions (``"X-Internal-*"`` denies a
  prefix). Always wins.

Every replay carries ``Idempotent-Replayed: true``.

Headers that describe the body are stored with it, including those a middleware sets
after the view returns from the request's state: Django's ``LocaleMiddleware`` labels a
response ``Content-Language`` with the language active for the request, unless the
response has one. The snapshot is taken inside the view's wrapper, before middleware
runs, so it sets that label itself (on the response and on what is stored); a replay
carries the first response's language, and the retry's ``Accept-Language`` does not
relabel it. Middleware that transforms the body as it labels it (``GZipMiddleware``:
``Content-Encoding`` and the compressed bytes) works on the stored body again for each
replay, so its label and the body it sends agree.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.middleware.locale import LocaleMiddleware
from django.utils import translation
from django.utils.module_loading import import_string

from django_idempotency.conf import conf
from django_idempotency.store import StoredResponse

REPLAYED_HEADER = "Idempotent-Replayed"

#: Never stored or replayed, whatever the configuration says.
FORBIDDEN_HEADERS = frozenset(
    {
        # credentials and state of this exchange
        "set-cookie",
        "set-cookie2",
        "cookie",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "authentication-info",
        "proxy-authentication-info",
        # hop-by-hop (RFC 9110 §7.6.1) and framing
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        # the moment of the exchange
        "date",
        # per-request tracing and correlation ids
        "traceparent",
        "tracestate",
        "baggage",
        "x-request-id",
        "x-correlation-id",
        "request-id",
        "correlation-id",
        "x-amzn-trace-id",
        "x-amzn-requestid",
        "x-amz-request-id",
        "x-cloud-trace-context",
        "b3",
        "uber-trace-id",
        "sentry-trace",
        "x-trace-id",
        "x-span-id",
        "server-timing",
        # our own marker
        REPLAYED_HEADER.lower(),
    }
)

#: Name prefixes that are forbidden like :data:`FORBIDDEN_HEADERS`.
FORBIDDEN_PREFIXES = ("proxy-", "x-b3-", "x-datadog-")

#: Dropped by default, kept when named in ``REPLAY_HEADERS`` / ``replay_headers=``.
EXCHANGE_HEADERS = frozenset(
    {
        "server",
        "via",
        "age",
        "x-runtime",
        "x-response-time",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    }
)

#: Name prefixes dropped by default like :data:`EXCHANGE_HEADERS`.
EXCHANGE_PREFIXES = ("access-control-", "x-ratelimit-")

#: Statuses whose responses have no body, so no ``Content-Length`` (RFC 9110 §8.6).
_NO_BODY = frozenset({204, 304})


def is_forbidden(name: str) -> bool:
    """Whether header ``name`` (any case) is never stored or replayed."""
    lower = name.lower()
    return lower in FORBIDDEN_HEADERS or lower.startswith(FORBIDDEN_PREFIXES)


def _split(names: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """Exact lower-case names and the prefixes of the ``"Prefix-*"`` entries."""
    exact, prefixes = set(), []
    for name in names:
        lower = name.strip().lower()
        if lower.endswith("*"):
            prefixes.append(lower[:-1])
        elif lower:
            exact.add(lower)
    return frozenset(exact), tuple(prefixes)


@dataclass(frozen=True)
class HeaderPolicy:
    """Which header names are stored and replayed.

    Build it with :meth:`current`; ``keep`` are the lower-case names that override
    the exchange denylist, ``deny`` and ``deny_prefixes`` the project's additions.
    """

    keep: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()
    deny_prefixes: tuple[str, ...] = ()

    @classmethod
    def current(cls, keep: Iterable[str] = ()) -> HeaderPolicy:
        """The policy now: ``REPLAY_DENY_HEADERS`` read at call time, plus ``keep``.

        Args:
            keep: header names to keep although the exchange denylist drops them
                (``REPLAY_HEADERS`` and the view's ``replay_headers=``).
        """
        deny, prefixes = _split(conf.replay_deny_headers)
        return cls(frozenset(n.lower() for n in keep), deny, prefixes)

    def allows(self, name: str) -> bool:
        """Whether header ``name`` (any case) is stored and replayed."""
        lower = name.lower()
        if is_forbidden(lower) or lower in self.deny or lower.startswith(self.deny_prefixes):
            return False
        if lower in self.keep:
            return True
        return lower not in EXCHANGE_HEADERS and not lower.startswith(EXCHANGE_PREFIXES)

    def filter(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The ``(name, value)`` pairs of ``headers`` this policy allows, in order."""
        return [(name, value) for name, value in headers if self.allows(name)]


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


@functools.lru_cache(maxsize=8)
def _labels_language(middleware: tuple[str, ...]) -> bool:
    """Whether ``middleware`` (dotted paths) holds Django's ``LocaleMiddleware``."""
    for dotted in middleware:
        try:
            factory = import_string(dotted)
        except ImportError:  # Django itself fails on it first
            continue
        if isinstance(factory, type) and issubclass(factory, LocaleMiddleware):
            return True
    return False


def label_language(response: HttpResponseBase) -> None:
    """Set ``Content-Language`` as ``LocaleMiddleware`` will, before it is stored.

    ``LocaleMiddleware`` labels the response with the language active when it comes
    back through the middleware (the request's), unless it has a label already; that
    is after the snapshot. Set here, the label is stored and replayed with the body it
    describes, and the middleware keeps it, on the first response and on a replay to a
    retry in another language. Nothing is set where no ``LocaleMiddleware`` is
    installed, or where the view set the header itself.
    """
    if response.has_header("Content-Language"):
        return
    if not _labels_language(tuple(getattr(settings, "MIDDLEWARE", None) or ())):
        return
    language = translation.get_language()
    if language:
        response["Content-Language"] = language


def snapshot(response: HttpResponseBase, extra_headers: Iterable[str]) -> StoredResponse:
    """What to store of ``response``: status, every allowed header, body bytes.

    Args:
        response: the view's final (rendered) response.
        extra_headers: names kept although the exchange denylist drops them
            (``REPLAY_HEADERS`` plus the view's ``replay_headers=``).

    A streaming response is consumed; pass the result to :func:`build` to answer
    with it (the original's iterator is spent). ``Content-Language`` is set first
    where ``LocaleMiddleware`` would set it later (:func:`label_language`).
    """
    label_language(response)
    headers = HeaderPolicy.current(extra_headers).filter(response.items())
    return StoredResponse(response.status_code, headers, response_body(response))


def rebuild_consumed(original: HttpResponseBase, stored: StoredResponse) -> HttpResponse:
    """A plain response with ``stored``'s body, for a streaming ``original`` we consumed.

    The original's resource closers (open files of a ``FileResponse``) move to the new
    response, so Django closes them when it closes the response it sends.
    """
    response = build(stored, replayed=False)
    for name, value in original.items():
        if name.lower() != "content-length" and name.lower() not in {
            n.lower() for n, _ in stored.headers
        }:
            response[name] = value
    for cookie in original.cookies.values():
        response.cookies[cookie.key] = cookie
    closers = getattr(original, "_resource_closers", None)
    if closers is not None:
        response._resource_closers.extend(closers)  # type: ignore[attr-defined]
        closers.clear()
    return response


def build(
    stored: StoredResponse, *, replayed: bool, policy: HeaderPolicy | None = None
) -> HttpResponse:
    """Turn a stored response back into an ``HttpResponse``.

    Args:
        stored: status, headers and body bytes.
        replayed: add ``Idempotent-Replayed: true`` (a replay) or not (the first
            answer rebuilt from a consumed streaming response).
        policy: the headers to send of those stored: a replay passes the current
            policy, so a name denied after the record was stored is not replayed.
            ``None``: every stored header.

    ``Content-Length`` is set to the length of the stored body (none on 1xx, 204, 304).
    """
    response = HttpResponse(stored.body, status=stored.status)
    del response["Content-Type"]
    headers = stored.headers if policy is None else policy.filter(stored.headers)
    for name, value in headers:
        response[name] = value
    if stored.status >= 200 and stored.status not in _NO_BODY:
        response["Content-Length"] = str(len(stored.body))
    if replayed:
        response[REPLAYED_HEADER] = "true"
    return response
