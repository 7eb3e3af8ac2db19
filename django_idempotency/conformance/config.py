"""What the user tells the check: the endpoint, its request, its principals, the limits."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

#: The checks, in the order they run; ``--skip`` takes these names.
CHECK_NAMES = (
    "safe-method",
    "concurrent-duplicates",
    "concurrent-effects",
    "replay-status",
    "replay-body",
    "replay-headers",
    "replay-marker",
    "replay-per-exchange",
    "replay-effects",
    "principal-scoping",
    "key-reused",
    "key-missing",
    "key-empty",
    "key-too-long",
    "key-non-ascii",
    "key-two-lines",
    "in-flight",
    "retry-after-on-409",
    "problem-json",
)

#: Hard ceilings that no option lifts: the most duplicates, requests and seconds.
MAX_CONCURRENCY = 200
MAX_REQUESTS = 1000
MAX_SECONDS = 900.0

#: The JSON member added to a JSON object body to make "another body" for ``key-reused``.
PROBE_MEMBER = "idempotency_conformance_probe"


class ConfigError(ValueError):
    """An option is out of range or inconsistent; the message says which and why."""


def parse_header(line: str) -> tuple[str, str]:
    """``"Name: value"`` as ``("Name", "value")``.

    Raises:
        ConfigError: there is no colon, or the name is empty.
    """
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise ConfigError(f"a header is written 'Name: value', not {line!r}")
    return name.strip(), value.strip()


@dataclass(frozen=True)
class Config:
    """One run of the conformance check.

    Attributes:
        url: the endpoint's absolute URL (``http`` or ``https``); every request goes there.
        method: the unsafe method the endpoint takes (``POST``, ``PUT``, ``PATCH``,
            ``DELETE``).
        body: the request body sent on every execution, as bytes (``b""``: none).
        content_type: its ``Content-Type`` (``None``: none sent).
        headers: sent on every request (``Authorization`` of the first principal...).
        other_headers: replace ``headers`` of the same name for a second principal
            (``principal-scoping``); empty: that check is skipped.
        other_body: the body of ``key-reused`` (``None``: derived from ``body``).
        effect_url: a URL that answers the number of effects (``GET``, same headers).
        effect_field: a dotted path into its JSON answer (a list counts its items).
        effect_command: a shell command that prints the number of effects.
        concurrency: N, the concurrent duplicates sent with one key.
        timeout: seconds for one request.
        time_budget: seconds for the whole run; no request starts after it.
        max_requests: the most requests the run may send, effect reads included.
        max_key_length: the longest key the endpoint accepts; ``key-too-long`` sends
            one character more.
        key_required: the endpoint refuses a request without a key (``key-missing``).
        safe_method: the method of ``safe-method`` (``""``: that check is skipped).
        slow_query: a query string added to ``url`` to make the handler slow for
            ``in-flight`` (``None``: that check is skipped; ``""``: the handler is slow
            as it is).
        in_flight_delay: seconds between the original and its duplicate in ``in-flight``.
        in_flight_quick: the most seconds the duplicate's 409 may take in ``in-flight``.
        replay_delay: seconds to wait before the replay when the first answer has a
            ``Date``, so that a repeated ``Date`` shows (under 1: ``Date`` is not judged).
        skip: names of checks not to run.
    """

    url: str
    method: str = "POST"
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    other_headers: tuple[tuple[str, str], ...] = ()
    other_body: bytes | None = None
    effect_url: str | None = None
    effect_field: str | None = None
    effect_command: str | None = None
    concurrency: int = 20
    timeout: float = 10.0
    time_budget: float = 120.0
    max_requests: int = 200
    max_key_length: int = 255
    key_required: bool = True
    safe_method: str = "GET"
    slow_query: str | None = None
    in_flight_delay: float = 0.5
    in_flight_quick: float = 1.0
    replay_delay: float = 1.0
    skip: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", self.method.upper())
        object.__setattr__(self, "safe_method", self.safe_method.upper())
        self.validate()

    def validate(self) -> None:
        """Refuse what would send traffic elsewhere or without bounds.

        Raises:
            ConfigError: a URL is not absolute http(s), the method is safe, a number is
                out of range, or a skipped check does not exist.
        """
        for name, url in (("url", self.url), ("effect URL", self.effect_url)):
            if url is not None and urlsplit(url).scheme not in ("http", "https"):
                raise ConfigError(f"the {name} must be an absolute http(s) URL, not {url!r}")
            if url is not None and not urlsplit(url).hostname:
                raise ConfigError(f"the {name} has no host: {url!r}")
        if self.method in ("GET", "HEAD", "OPTIONS", "TRACE"):
            raise ConfigError(f"{self.method} is a safe method: keys are ignored on it")
        if self.effect_url and self.effect_command:
            raise ConfigError("count effects with a URL or a command, not both")
        if not 2 <= self.concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"N must be 2 to {MAX_CONCURRENCY}, not {self.concurrency}")
        if not 0 < self.timeout <= self.time_budget <= MAX_SECONDS:
            raise ConfigError(
                f"need 0 < timeout ({self.timeout}) <= time budget ({self.time_budget}) "
                f"<= {MAX_SECONDS:.0f} seconds"
            )
        if not 1 <= self.max_requests <= MAX_REQUESTS:
            raise ConfigError(f"the request cap must be 1 to {MAX_REQUESTS}")
        if not 1 <= self.max_key_length <= 4096:
            raise ConfigError("the longest key must be 1 to 4096 characters")
        if not 0 <= self.in_flight_delay < self.timeout or not self.in_flight_quick > 0:
            raise ConfigError("the in-flight delay must be under the timeout, its limit above 0")
        if not 0 <= self.replay_delay <= 5:
            raise ConfigError("the replay delay must be 0 to 5 seconds")
        unknown = sorted(self.skip - set(CHECK_NAMES))
        if unknown:
            raise ConfigError(f"no such check: {', '.join(unknown)}; see --list-checks")
        if self.planned_requests() > self.max_requests:
            raise ConfigError(
                f"this run sends up to {self.planned_requests()} requests, above the cap of "
                f"{self.max_requests}: lower N or raise --max-requests"
            )

    @property
    def counts_effects(self) -> bool:
        """An effect counter was given."""
        return bool(self.effect_url or self.effect_command)

    @property
    def slow_url(self) -> str | None:
        """The URL of ``in-flight``: ``url`` with ``slow_query`` added (``None``: no check)."""
        if self.slow_query is None:
            return None
        parts = urlsplit(self.url)
        query = "&".join(q for q in (parts.query, self.slow_query.lstrip("?&")) if q)
        return urlunsplit(parts._replace(query=query))

    def runs(self, name: str) -> bool:
        """Whether the check ``name`` runs (not skipped, and its inputs were given)."""
        if name in self.skip:
            return False
        if name == "principal-scoping":
            return bool(self.other_headers)
        if name == "in-flight":
            return self.slow_query is not None
        if name == "key-missing":
            return self.key_required
        if name == "safe-method":
            return bool(self.safe_method)
        if name in ("concurrent-effects", "replay-effects"):
            return self.counts_effects
        return True

    def planned_requests(self) -> int:
        """The most requests the run sends to the endpoint and the effect URL."""
        reads = 2 if self.effect_url else 0
        keys = ("key-missing", "key-empty", "key-too-long", "key-non-ascii", "key-two-lines")
        total = self.concurrency + reads + 2 + reads  # the duplicates; the replay pair
        total += 1 if self.runs("principal-scoping") else 0
        total += 1 + reads if self.runs("key-reused") else 0
        total += sum(1 + reads for name in keys if self.runs(name))
        total += 4 if self.runs("safe-method") else 0
        total += 2 if self.runs("in-flight") else 0
        return total

    def reuse_body(self) -> tuple[bytes, str | None]:
        """The body and Content-Type of ``key-reused``: another request, same key.

        ``other_body`` when given; else a JSON object body with the member
        ``idempotency_conformance_probe`` added; else ``{"idempotency_conformance_probe":
        ...}`` for an empty body; else the body with a newline appended.
        """
        if self.other_body is not None:
            return self.other_body, self.content_type
        probe = str(uuid.uuid4())
        if not self.body:
            return json.dumps({PROBE_MEMBER: probe}).encode(), "application/json"
        try:
            document = json.loads(self.body)
        except ValueError:
            document = None
        if isinstance(document, dict):
            document[PROBE_MEMBER] = probe
            return json.dumps(document).encode(), self.content_type
        return self.body + b"\n", self.content_type
