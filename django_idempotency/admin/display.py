"""What the admin pages show: times to the second by the store's clock, bodies as replayed."""

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import connections
from django.http import HttpRequest

from django_idempotency.models import IdempotencyRecord
from django_idempotency.store import clock, operators

#: Longest key shown in full in the record list (the detail page shows it all).
KEY_LIST_CHARS = 40

#: Now by the store's clock, read once per admin page (``admin_page``).
PAGE_NOW: ContextVar[dt.datetime | None] = ContextVar("django_idempotency_admin_now", default=None)
#: The request of the admin page being rendered (``admin_page``): who is looking.
VIEWER: ContextVar[HttpRequest | None] = ContextVar("django_idempotency_admin_viewer", default=None)


@contextmanager
def admin_page(request: HttpRequest, using: str) -> Iterator[None]:
    """Inside the block, one "now" of the store's clock and the viewer, for the page.

    The page's times are judged at that "now"; its links follow the viewer's
    permissions.
    """
    now_token = PAGE_NOW.set(clock.store_now(connections[using]))
    viewer_token = VIEWER.set(request)
    try:
        yield
    finally:
        VIEWER.reset(viewer_token)
        PAGE_NOW.reset(now_token)


def store_now(using: str) -> dt.datetime:
    """The page's "now" (``_store_clock``), else read from the store's clock."""
    return PAGE_NOW.get() or clock.store_now(connections[using])


def as_utc(value: dt.datetime, using: str) -> dt.datetime:
    """``value`` as read from the database ``using``, as an aware UTC datetime."""
    return clock.from_db(value, connections[using])


def when_text(value: dt.datetime | None, obj: Any, text: str = "{}") -> str:
    """``value`` to the second in UTC, with ``text`` about how far it is from now.

    ``text`` holds ``{}`` where the relative time goes ("lease ends {}").
    """
    if value is None:
        return "-"
    using = obj._state.db or "default"
    moment = as_utc(value, using)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({relative_text(text, moment, using)})"


def relative_text(text: str, moment: dt.datetime, using: str) -> str:
    """``text`` with ``{}`` replaced by how far ``moment`` is from the page's now."""
    return text.format(operators.relative(moment, store_now(using)))


def lease_text(obj: Any) -> str:
    """``lease ends in 42 s`` / ``lease ended 3 min ago`` (``by an operator`` when so)."""
    using = obj._state.db or "default"
    moment = as_utc(obj.lease_until, using)
    if moment > store_now(using):
        return "lease ends {}"
    if obj.lease_until == obj.created_at:
        return "lease ended by an operator {}"
    return "lease ended {}"


#: Media types shown as text besides ``text/*`` (and ``+json``, ``+xml`` suffixes).
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/problem+json",
        "application/xml",
        "application/javascript",
        "application/x-www-form-urlencoded",
        "application/x-ndjson",
        "application/yaml",
    }
)


def stored_content_type(obj: IdempotencyRecord) -> str:
    """The stored ``Content-Type`` header ("" if none was stored)."""
    return next((v for n, v in obj.response_headers or () if n.lower() == "content-type"), "")


def body_text(body: bytes, content_type: str) -> str | None:
    """``body`` as the text a client reads from it; ``None`` if it is not text.

    Text is a ``text/*``, JSON, XML or form media type (the ``charset`` parameter, else
    UTF-8) whose bytes decode without error in that charset; the text is the bytes
    decoded, nothing re-sorted or re-indented. An empty ``content_type`` counts as text
    when the bytes are UTF-8.

    Args:
        body: the body exactly as a replay sends it (``store.decode_body``).
        content_type: the stored ``Content-Type`` header value.
    """
    media, *params = (part.strip() for part in content_type.split(";"))
    media = media.lower()
    textual = (
        not media
        or media.startswith("text/")
        or media in TEXT_TYPES
        or media.endswith(("+json", "+xml"))
    )
    if not textual:
        return None
    charset = "utf-8"
    for param in params:
        name, _sep, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"')
    try:
        return body.decode(charset)
    except (LookupError, UnicodeDecodeError):
        return None
