"""The ``IDEMPOTENCY`` settings dict, typed and read at access time.

Every property calls ``getattr(settings, "IDEMPOTENCY", {})`` when it is read, so
``override_settings(IDEMPOTENCY={...})`` takes effect immediately and nothing is cached
at import. Each key is documented in ``docs/configuration.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

#: Defaults for every key of ``settings.IDEMPOTENCY``.
DEFAULTS: dict[str, Any] = {
    "REQUIRED": True,
    "LEASE": 60.0,
    "RETENTION": 24 * 60 * 60.0,
    "WAIT": 0.0,
    "RETRY_AFTER": 1,
    "MAX_KEY_LENGTH": 255,
    "REPLAY_HEADERS": (),
    "REPLAY_DENY_HEADERS": (),
    "FINGERPRINT_EXCLUDE": (),
    "FINGERPRINT_HEADERS": (),
    "FINGERPRINT_FORM_TOKENS": ("csrfmiddlewaretoken",),
    "PRINCIPAL_RESOLVER": "django_idempotency.principals.user_principal",
    "RELEASE_STATUSES": (408, 409, 425, 429),
    "RELEASE_PREDICATE": None,
    "PROBLEM_TYPE_BASE": "tag:django-idempotency,2026:problems#",
    # Robustness and security (docs/robustness.md, docs/security.md).
    "MAX_RESPONSE_BYTES": 1024 * 1024,
    "BODY_CODEC": None,
    # Outbox and relay (docs/outbox.md).
    "OUTBOX_BATCH_SIZE": 100,
    "OUTBOX_RELAY_LEASE": 120.0,
    "OUTBOX_MAX_ATTEMPTS": 25,
    "OUTBOX_BACKOFF_BASE": 2.0,
    "OUTBOX_BACKOFF_CAP": 21600.0,
    "OUTBOX_KICK": True,
    "OUTBOX_MARK_DELAY": 0.005,
    "OUTBOX_RELAY_THREADS": 1,
    # Retention and the sweeper (docs/retention.md).
    "MAX_RETENTION": 7 * 24 * 60 * 60.0,
    "PARTITION_RECORDS": True,
    "PARTITIONS_AHEAD": 3,
    "SWEEP_BATCH_SIZE": 5000,
    "OUTBOX_RETENTION": 7 * 24 * 60 * 60.0,
    # Where records live (docs/deployment.md).
    "DATABASE_RESOLVER": None,
    "DATABASES": None,
    "UNGUARDED_DATABASES": (),
    # Owner presence, heartbeat, waiters (docs/robustness.md#owner-presence).
    "OWNER_PRESENCE": "auto",
    "HEARTBEAT": False,
    "MAX_WAITERS": 16,
    # Failure signatures (docs/observability.md#failure-signatures).
    "LEASE_WARNING_FRACTION": 0.8,
    "RETENTION_WARNING_FRACTION": 0.8,
}


@functools.lru_cache(maxsize=64)
def _import(path: str) -> Any:
    return import_string(path)


def resolve_callable(value: str | Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Return ``value`` itself if callable, the object at a dotted path if a string.

    Imports are cached per path, so no request pays for ``import_string``.
    """
    if value is None or callable(value):
        return value
    return _import(value)  # type: ignore[no-any-return]


def _names(value: str | Collection[str]) -> tuple[str, ...]:
    """A list setting of header names as a tuple; one string is one name."""
    return (value,) if isinstance(value, str) else tuple(value)


class IdempotencySettings:
    """Typed, lazy view of ``settings.IDEMPOTENCY``.

    Properties read Django settings on every access; never store their values at import
    time. Units: every duration is in seconds (``float``).
    """

    @property
    def raw(self) -> dict[str, Any]:
        """The user's ``IDEMPOTENCY`` dict as set (``{}`` when absent)."""
        value = getattr(settings, "IDEMPOTENCY", {})
        return value if isinstance(value, dict) else {}

    def get(self, name: str) -> Any:
        """Return setting ``name``: the user's value, or the default from ``DEFAULTS``.

        Raises:
            KeyError: ``name`` is not a known setting.
        """
        return self.raw.get(name, DEFAULTS[name])

    @property
    def required(self) -> bool:
        """Whether a missing ``Idempotency-Key`` is a 400 (``True``) or runs unprotected."""
        return bool(self.get("REQUIRED"))

    @property
    def lease(self) -> float:
        """Claim lease in seconds: how long an in-flight claim blocks duplicates."""
        return float(self.get("LEASE"))

    @property
    def retention(self) -> float:
        """Retention window in seconds: how long a completed response is replayed."""
        return float(self.get("RETENTION"))

    @property
    def wait(self) -> float:
        """Seconds a duplicate waits for an in-flight original before answering 409."""
        return float(self.get("WAIT"))

    @property
    def retry_after(self) -> int:
        """Seconds sent in ``Retry-After`` with a 409 (request in flight) or 503."""
        return int(self.get("RETRY_AFTER"))

    @property
    def max_key_length(self) -> int:
        """Longest accepted key, in characters (at most 255, the column's size)."""
        return int(self.get("MAX_KEY_LENGTH"))

    @property
    def replay_headers(self) -> tuple[str, ...]:
        """Headers replayed although the exchange denylist drops them (``Server``, ...).

        Every other header is replayed without configuration (docs/protocol.md#replay);
        before, this setting extended an allowlist, and such lists keep working.
        """
        return _names(self.get("REPLAY_HEADERS"))

    @property
    def replay_deny_headers(self) -> tuple[str, ...]:
        """Response headers never stored or replayed, besides the built-in denylist.

        Names, any case; ``"X-Internal-*"`` denies every name with that prefix.
        """
        return _names(self.get("REPLAY_DENY_HEADERS"))

    @property
    def fingerprint_exclude(self) -> tuple[str, ...]:
        """Body fields (dotted paths for nested JSON) left out of the fingerprint."""
        return tuple(self.get("FINGERPRINT_EXCLUDE"))

    @property
    def fingerprint_headers(self) -> tuple[str, ...]:
        """Request headers whose values are part of the fingerprint."""
        return tuple(self.get("FINGERPRINT_HEADERS"))

    @property
    def fingerprint_form_tokens(self) -> tuple[str, ...]:
        """Form fields carrying a per-render token, left out of form fingerprints.

        By default Django's CSRF field, ``csrfmiddlewaretoken``: Django masks the token
        afresh on every render and rotates it at login, so a retried form carries
        another value for the same request. Only form bodies (urlencoded, multipart)
        are affected; ``[]`` puts the field back into the fingerprint.
        """
        return _names(self.get("FINGERPRINT_FORM_TOKENS"))

    @property
    def principal_resolver(self) -> Callable[..., str | None]:
        """``callable(request) -> str | None`` naming the principal of a request."""
        resolver = resolve_callable(self.get("PRINCIPAL_RESOLVER"))
        assert resolver is not None
        return resolver

    @property
    def release_statuses(self) -> Collection[int]:
        """Non-5xx statuses that release the key instead of being stored (every 5xx does)."""
        return frozenset(int(s) for s in self.get("RELEASE_STATUSES"))

    @property
    def release_predicate(self) -> Callable[[int], bool] | None:
        """Optional ``callable(status) -> bool`` replacing the release-status rule."""
        return resolve_callable(self.get("RELEASE_PREDICATE"))

    @property
    def problem_type_base(self) -> str:
        """Prefix of every problem ``type`` URI; the problem's slug is appended."""
        return str(self.get("PROBLEM_TYPE_BASE"))

    @property
    def max_response_bytes(self) -> int | None:
        """Largest response body, in bytes, stored for replay (``None``: no limit).

        A larger response still reaches the client and its completion still commits,
        but only its status and headers are kept: a replay answers 410
        ``response-too-large-to-replay`` (docs/robustness.md).
        """
        value = self.get("MAX_RESPONSE_BYTES")
        return None if value is None else int(value)

    @property
    def body_codec(self) -> Any:
        """The codec of stored response bodies, or ``None`` to store them as they are.

        An object with ``encode(bytes) -> bytes`` and ``decode(bytes) -> bytes`` (e.g.
        encryption at rest); the setting is the object or its dotted path
        (docs/security.md).
        """
        value = self.get("BODY_CODEC")
        return _import(value) if isinstance(value, str) else value

    @property
    def outbox_batch_size(self) -> int:
        """Messages the relay claims per batch (``deliver_batch`` default)."""
        return int(self.get("OUTBOX_BATCH_SIZE"))

    @property
    def outbox_relay_lease(self) -> float:
        """Seconds a relay holds the messages it claimed before others may redeliver them."""
        return float(self.get("OUTBOX_RELAY_LEASE"))

    @property
    def outbox_max_attempts(self) -> int:
        """Delivery attempts before a message is dead-lettered (state ``dead``)."""
        return int(self.get("OUTBOX_MAX_ATTEMPTS"))

    @property
    def outbox_backoff_base(self) -> float:
        """Seconds: the retry delay's bound after the first failure (then doubles)."""
        return float(self.get("OUTBOX_BACKOFF_BASE"))

    @property
    def outbox_backoff_cap(self) -> float:
        """Seconds: the largest retry delay upper bound."""
        return float(self.get("OUTBOX_BACKOFF_CAP"))

    @property
    def outbox_mark_delay(self) -> float:
        """Seconds a delivered message may wait to be marked sent with the next ones.

        The relay commits the marks of its delivered messages in groups whose oldest
        mark is at most this old (docs/outbox.md, "Marks"); ``0`` marks each message
        before the next handler starts. Keep it far below half the relay lease.
        """
        return max(0.0, float(self.get("OUTBOX_MARK_DELAY")))

    @property
    def outbox_relay_threads(self) -> int:
        """Handlers one relay runs at the same time (a bounded thread pool; 1: inline)."""
        return max(1, int(self.get("OUTBOX_RELAY_THREADS")))

    @property
    def outbox_kick(self) -> bool:
        """Whether a commit that enqueued messages starts the Celery relay task at once."""
        return bool(self.get("OUTBOX_KICK"))

    @property
    def max_retention(self) -> float:
        """Seconds: the longest retention window of any view; older days are swept.

        Must be at least ``RETENTION`` and every view's ``retention`` (checks E006,
        W002). The sweeper drops (PostgreSQL partitions) or deletes the records of
        every whole UTC day that ended more than this long ago.
        """
        return float(self.get("MAX_RETENTION"))

    @property
    def partition_records(self) -> bool:
        """Whether the initial migration partitions the record table by day on PostgreSQL.

        Read when ``migrate`` applies the initial migration, not at run time: the store detects the
        table's kind on each database connection. See docs/retention.md to switch.
        """
        return bool(self.get("PARTITION_RECORDS"))

    @property
    def partitions_ahead(self) -> int:
        """Days of partitions the sweeper keeps created ahead of today (PostgreSQL)."""
        return int(self.get("PARTITIONS_AHEAD"))

    @property
    def sweep_batch_size(self) -> int:
        """Rows per DELETE when the sweeper deletes instead of dropping partitions."""
        return int(self.get("SWEEP_BATCH_SIZE"))

    @property
    def outbox_retention(self) -> float:
        """Seconds a sent outbox message is kept (after ``sent_at``) before it is swept."""
        return float(self.get("OUTBOX_RETENTION"))

    @property
    def database_resolver(self) -> Callable[..., str] | None:
        """Optional ``callable(request) -> alias``: the database of a request's record.

        For tenant-sharded projects (docs/deployment.md); a view's ``using=`` wins.
        ``None``: the router's ``db_for_write`` for ``IdempotencyRecord``.
        """
        return resolve_callable(self.get("DATABASE_RESOLVER"))

    @property
    def databases(self) -> tuple[str, ...] | None:
        """Aliases of the records and outbox messages: what the sweeper and relay cover.

        ``None``: the router's aliases for each (``databases.all_databases``).
        """
        value = self.get("DATABASES")
        return None if value is None else _names(value)

    @property
    def unguarded_databases(self) -> frozenset[str]:
        """Aliases an idempotent view may write to outside its record's transaction."""
        return frozenset(_names(self.get("UNGUARDED_DATABASES")))

    @property
    def owner_presence(self) -> bool | str:
        """Owner presence on PostgreSQL: ``"auto"``, ``True`` or ``False``.

        ``"auto"``: a claim's session holds the presence lock when its connection is
        direct (not through a transaction pooler, as far as that can be detected:
        ``presence.direct``); ``True``: always (you know there is no pooler); ``False``:
        never, and no takeover by presence either. docs/robustness.md#owner-presence.

        Raises:
            ValueError: another value.
        """
        value = self.get("OWNER_PRESENCE")
        if value in (True, False) or value == "auto":
            return value  # type: ignore[no-any-return]
        raise ValueError(f'IDEMPOTENCY["OWNER_PRESENCE"] is "auto", True or False, not {value!r}')

    @property
    def heartbeat(self) -> bool:
        """Whether views extend their lease from a background thread while they run.

        A view's ``heartbeat=`` option overrides it. Every third of the lease, on
        PostgreSQL (docs/robustness.md#automatic-heartbeat).
        """
        return bool(self.get("HEARTBEAT"))

    @property
    def max_waiters(self) -> int:
        """Duplicates per process that may wait on an owner's lock at once (``wait=``).

        Each holds a database session while it waits; past this many, a duplicate is
        answered 409 at once instead of waiting.
        """
        return int(self.get("MAX_WAITERS"))

    @property
    def lease_warning_fraction(self) -> float:
        """Share of its lease past which an execution counts as near it (0 to 1].

        Such an execution logs a WARNING naming the endpoint and counts in the
        ``executions_near_lease`` metric (docs/observability.md#failure-signatures).
        """
        return float(self.get("LEASE_WARNING_FRACTION"))

    @property
    def retention_warning_fraction(self) -> float:
        """Share of its retention window past which a replayed record counts as late.

        Such a replay counts in the ``replays_near_window_end`` metric: a retry that came
        a little later would have found no record (docs/observability.md).
        """
        return float(self.get("RETENTION_WARNING_FRACTION"))


conf = IdempotencySettings()
