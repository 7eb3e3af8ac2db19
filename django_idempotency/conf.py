"""The ``IDEMPOTENCY`` settings dict, typed and read at access time.

Every property calls ``getattr(settings, "IDEMPOTENCY", {})`` when it is read, so
``override_settings(IDEMPOTENCY={...})`` takes effect immediately and nothing is cached
at import. Each key is documented in ``docs/configuration.md``.
"""

from __future__ import annotations

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
    "FINGERPRINT_EXCLUDE": (),
    "FINGERPRINT_HEADERS": (),
    "PRINCIPAL_RESOLVER": "django_idempotency.principals.user_principal",
    "RELEASE_STATUSES": (408, 409, 425, 429),
    "RELEASE_PREDICATE": None,
    "PROBLEM_TYPE_BASE": "https://django-idempotency.readthedocs.io/en/stable/problems/#",
}


def _resolve_callable(value: str | Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Return ``value`` itself if callable, the object at a dotted path if a string."""
    if value is None or callable(value):
        return value
    return import_string(value)  # type: ignore[no-any-return]


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
        """Extra response headers stored and replayed, besides the standard allowlist."""
        return tuple(self.get("REPLAY_HEADERS"))

    @property
    def fingerprint_exclude(self) -> tuple[str, ...]:
        """Body fields (dotted paths for nested JSON) left out of the fingerprint."""
        return tuple(self.get("FINGERPRINT_EXCLUDE"))

    @property
    def fingerprint_headers(self) -> tuple[str, ...]:
        """Request headers whose values are part of the fingerprint."""
        return tuple(self.get("FINGERPRINT_HEADERS"))

    @property
    def principal_resolver(self) -> Callable[..., str | None]:
        """``callable(request) -> str | None`` naming the principal of a request."""
        resolver = _resolve_callable(self.get("PRINCIPAL_RESOLVER"))
        assert resolver is not None
        return resolver

    @property
    def release_statuses(self) -> Collection[int]:
        """Non-5xx statuses that release the key instead of being stored (every 5xx does)."""
        return frozenset(int(s) for s in self.get("RELEASE_STATUSES"))

    @property
    def release_predicate(self) -> Callable[[int], bool] | None:
        """Optional ``callable(status) -> bool`` replacing the release-status rule."""
        return _resolve_callable(self.get("RELEASE_PREDICATE"))

    @property
    def problem_type_base(self) -> str:
        """Prefix of every problem ``type`` URI; the problem's slug is appended."""
        return str(self.get("PROBLEM_TYPE_BASE"))


conf = IdempotencySettings()
