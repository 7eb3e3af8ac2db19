"""Reading an answer: a replay or not, its problem+json, its ``Retry-After``, the verdict.

The verdict is the client's whole retry policy in one function: which answers are a
success, which mean "retry with the same key", which are final. See docs/client.md.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from typing import Any, Literal

import httpx

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
PROBLEM_JSON = "application/problem+json"
#: 409 problem types (slugs of the ``type`` URI) that ask the client to retry.
RETRYABLE_CONFLICTS = ("request-in-flight", "lease-lost")
#: 5xx statuses that say "never" rather than "not now".
PERMANENT_5XX = frozenset({501, 505})
#: The problem type of a 500 that says the server has no idempotency store for this
#: site (a misconfiguration, docs/problems.md): nothing ran, and a retry cannot help.
NOT_SET_UP = "store-not-set-up"
#: 4xx statuses on which django-idempotency releases the key by default (its
#: ``RELEASE_STATUSES`` setting but 409, which is judged by its problem type; see
#: docs/configuration.md), so a retry with the same key runs the view again. Not
#: retried by default; opt in with ``retry_statuses=RELEASED_4XX`` (Retry-After is
#: honoured).
RELEASED_4XX = frozenset({408, 425, 429})
#: The problem type of a 410 that answers a retry of a completed operation whose
#: response was too large to store: done, but not replayable.
NOT_REPLAYABLE = "response-too-large-to-replay"

Verdict = Literal["success", "retry", "fail"]


def is_replay(response: httpx.Response) -> bool:
    """Whether ``response`` is a replay of a stored answer (``Idempotent-Replayed: true``)."""
    value: str = response.headers.get(REPLAYED_HEADER, "")
    return value.strip().lower() == "true"


def problem_of(response: httpx.Response) -> dict[str, Any] | None:
    """The RFC 9457 problem details of ``response``, or ``None`` if it carries none.

    Returns the parsed JSON object when the Content-Type is
    ``application/problem+json`` and the body is a JSON object; never raises.
    """
    if not response.headers.get("Content-Type", "").startswith(PROBLEM_JSON):
        return None
    try:
        body = response.json()
    except (ValueError, RecursionError):  # not JSON, not text, or nested too deeply
        return None
    return body if isinstance(body, dict) else None


def problem_slug(response: httpx.Response) -> str:
    """The slug of ``response``'s problem ``type`` (``"lease-lost"``), ``""`` if none.

    The app's types are its ``PROBLEM_TYPE_BASE`` plus a slug, so the slug is what
    follows the last ``#``, ``/`` or ``:`` of the URI. A view's own problem types
    (``https://api.example.com/problems/name-taken``) have slugs of their own, so an
    answer of the view is never taken for one of the app's.
    """
    kind = str((problem_of(response) or {}).get("type", ""))
    return re.split(r"[#/:]", kind)[-1]


#: ``delay-seconds`` (RFC 9110 §10.2.3): ASCII digits only (``str.isdigit`` also
#: accepts digits such as ``²`` that ``float`` refuses).
_DELAY_SECONDS = re.compile(r"[0-9]+", re.ASCII)


def retry_after_seconds(response: httpx.Response) -> float | None:
    """``Retry-After`` (RFC 9110 §10.2.3) in seconds from now, or ``None``; never raises.

    Accepts delay-seconds (``"2"``, ASCII digits) and an HTTP-date (IMF-fixdate, or the
    obsolete RFC 850 and asctime forms a recipient must accept, RFC 9110 §5.6.7); a
    date in the past gives 0, a date without a zone is taken as UTC. Anything else (a
    sign, a fraction, other digits, a date out of range, several values) is ignored:
    ``None``. The client caps what it waits with :attr:`Backoff.max_retry_after`.
    """
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)  # a very long one is inf, which the backoff caps
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def verdict(response: httpx.Response, *, retry_statuses: frozenset[int] = frozenset()) -> Verdict:
    """What to do with ``response``: ``"success"``, ``"retry"`` or ``"fail"``.

    * below 400 (replays included): success;
    * 5xx but 501, 505 and the 500 ``store-not-set-up``: retry (the server released
      the key, or never claimed it);
    * 409 with problem type ``request-in-flight`` or ``lease-lost``: retry (the same
      key is being processed, or the attempt was fenced off and rolled back);
    * a status in ``retry_statuses`` (opt-in, e.g. 429): retry;
    * anything else (400, 401, 404, 422, another 409, ...): fail, never retried.
    """
    status = response.status_code
    if status < 400:
        return "success"
    if status >= 500:
        permanent = status in PERMANENT_5XX or problem_slug(response) == NOT_SET_UP
        return "fail" if permanent else "retry"
    if status in retry_statuses:
        return "retry"
    if status == 409 and problem_slug(response) in RETRYABLE_CONFLICTS:
        return "retry"
    return "fail"
