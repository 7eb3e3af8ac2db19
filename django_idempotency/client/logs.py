"""The client's log lines: one per retry scheduled and one when it gives up.

On the ``django_idempotency.client`` logger, in the style of the server's
``django_idempotency.events`` lines: a readable message, and ``extra=`` fields for JSON
formatters:

* ``event``: ``retry_scheduled`` (INFO) or ``gave_up`` (WARNING);
* ``method`` and ``url``: the request, its URL without credentials and with the values
  of its query parameters replaced by ``...`` (they may hold tokens);
* ``attempt``: the attempt that failed (1-based); ``wait``: seconds until the next one
  (``retry_scheduled`` only);
* ``reason``: what failed: ``503 store-unavailable``, ``409 request-in-flight``, ``502
  Bad Gateway``, ``ConnectError``;
* ``key_hash``: the first 12 hex characters of SHA-256 over the idempotency key, as the
  server logs it (the key itself is never logged).

stamina's own instrumentation would report each of these retries again as a bare
``stamina.retry_scheduled`` line: :func:`quiet_stamina` makes its hooks skip the
client's retries (only those), through ``stamina.instrumentation``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import httpx
from stamina.instrumentation import RetryDetails, get_on_retry_hooks, set_on_retry_hooks

from django_idempotency.client.errors import RetryAfter
from django_idempotency.client.responses import problem_slug

logger = logging.getLogger("django_idempotency.client")


def key_hash(key: str) -> str:
    """The server's ``key_hash`` of ``key``: 12 hex characters of SHA-256, safe to log."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def loggable_url(url: str) -> str:
    """``url`` without user info, and with ``...`` for the value of each query parameter.

    Returns the URL unchanged when httpx cannot parse it.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return url
    base = str(parsed.copy_with(query=None, fragment=None, username=None, password=None))
    names = [name for name, _ in parsed.params.multi_items()]
    return base if not names else base + "?" + "&".join(f"{name}=..." for name in names)


def reason(response: httpx.Response | None, error: Exception | None) -> str:
    """What failed: the status and problem type, or the status and its phrase, or the error."""
    if response is None:
        return type(error).__name__ if error is not None else "no response"
    slug = problem_slug(response)
    return f"{response.status_code} {slug or response.reason_phrase}".rstrip()


def _log(level: int, event: str, note: str, fields: dict[str, Any]) -> None:
    if not logger.isEnabledFor(level):
        return
    logger.log(
        level,
        "idempotency client %s: %s %s attempt=%s%s reason=%s key=%s",
        event,
        fields["method"],
        fields["url"],
        fields["attempt"],
        note,
        fields["reason"],
        fields["key_hash"],
        extra={"event": event, **fields},
    )


def retry_scheduled(
    *,
    method: str,
    url: str,
    key: str,
    attempt: int,
    wait: float,
    response: httpx.Response | None,
    error: Exception | None,
) -> None:
    """Log that ``attempt`` failed and the next one comes after ``wait`` seconds (INFO)."""
    fields = _fields(method, url, key, attempt, response, error)
    _log(logging.INFO, "retry_scheduled", f" wait={wait:.2f}s", {**fields, "wait": wait})


def gave_up(
    *,
    method: str,
    url: str,
    key: str,
    attempt: int,
    response: httpx.Response | None,
    error: Exception | None,
) -> None:
    """Log that the attempts or the time ran out after ``attempt`` (WARNING)."""
    _log(logging.WARNING, "gave_up", "", _fields(method, url, key, attempt, response, error))


def _fields(
    method: str,
    url: str,
    key: str,
    attempt: int,
    response: httpx.Response | None,
    error: Exception | None,
) -> dict[str, Any]:
    return {
        "method": method,
        "url": loggable_url(url),
        "attempt": attempt,
        "reason": reason(response, error),
        "key_hash": key_hash(key),
    }


@dataclass(frozen=True)
class SkipClientRetries:
    """A stamina retry hook that passes every retry to ``hook`` but the client's own.

    The client logs its retries itself (:func:`retry_scheduled`); stamina's hooks
    still see every other retry of the process.
    """

    hook: Any

    def __call__(self, details: RetryDetails) -> Any:
        """Call the hook, unless the retry is the client's (``caused_by`` its own)."""
        if isinstance(details.caused_by, RetryAfter):
            return None
        return self.hook(details)


_lock = threading.Lock()
_quieted: list[bool] = []


def quiet_stamina() -> None:
    """Make stamina's configured retry hooks skip the client's retries, once per process.

    Wraps each hook of ``stamina.instrumentation.get_on_retry_hooks()`` in
    :class:`SkipClientRetries` the first time a client is made. Hooks set afterwards
    with ``set_on_retry_hooks`` replace the wrapped ones, and see the client's retries.
    """
    with _lock:
        if _quieted:
            return
        _quieted.append(True)
        hooks = get_on_retry_hooks()
        set_on_retry_hooks([SkipClientRetries(hook) for hook in hooks])
