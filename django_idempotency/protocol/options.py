"""Per-view options of ``@idempotent(...)`` and ``IdempotentMixin``, merged with settings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from django_idempotency.conf import conf, resolve_callable
from django_idempotency.protocol.responses import FORBIDDEN_HEADERS
from django_idempotency.store.routing import for_request

PrincipalResolver = Callable[[Any], "str | None"]
KeyExtractor = Callable[[Any], "str | None"]
ReleasePredicate = Callable[[int], bool]


#: Longest phase name: the width of ``IdempotencyRecord.recovery_point``.
MAX_PHASE_LENGTH = 64


def validate_phases(value: object) -> tuple[str, ...]:
    """Check a view's ``phases=`` option and return it as a tuple.

    Raises:
        TypeError: not a list of distinct, non-empty strings of at most 64 characters.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            "phases takes the list of phase names in order, e.g. "
            f'phases=["allocated", "leased", "booted"], not {value!r}'
        )
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_PHASE_LENGTH:
            raise TypeError(
                f"each phase name must be a string of 1 to {MAX_PHASE_LENGTH} characters, "
                f"not {name!r}"
            )
    if len(set(names)) != len(names):
        raise TypeError(f"phase names must be distinct: {list(names)!r}")
    return names


@dataclass(frozen=True)
class Options:
    """What a view chose; ``None`` means "use the ``IDEMPOTENCY`` setting".

    Attributes:
        required: a missing key is a 400 (``True``) or runs unprotected (``False``).
        lease: seconds an in-flight claim holds off duplicates (heartbeats extend it).
        retention: seconds a completed response is replayed (Stripe: 24 h; provisioning
            endpoints often use 7 days).
        wait: seconds a duplicate waits for the original to finish before a 409.
        replay_headers: extra response headers to store and replay.
        fingerprint_exclude: body fields left out of the fingerprint (dotted paths).
        fingerprint_headers: request headers that are part of the fingerprint.
        principal: ``callable(request) -> str | None`` (or its dotted path); a ``None``
            result refuses the request.
        endpoint: a fixed endpoint name instead of "METHOD /route".
        release: ``callable(status) -> bool`` (or its dotted path): release (``True``)
            or store the response.
        phases: the names of the view's atomic phases, in order
            (docs/phases.md). Non-empty: the view runs outside one transaction and
            each ``request.idempotency.phase(name)`` block commits on its own.
        using: the database of the view's records: an alias, or
            ``callable(request) -> alias`` (or its dotted path) for a per-request
            choice such as a tenant's shard; ``None``: the ``DATABASE_RESOLVER``
            setting, then the router (docs/deployment.md). It must be the database
            the view writes to: writes to another one are refused.
        key: ``callable(request) -> str | None`` (or its dotted path) that takes the
            idempotency key from elsewhere in the request than ``Idempotency-Key``
            (a webhook's event id: ``django_idempotency.extractors``, docs/inbox.md).
        heartbeat: extend the lease from a background thread every third of it
            while the view runs (``None``: the ``HEARTBEAT`` setting;
            docs/robustness.md#automatic-heartbeat).
    """

    required: bool | None = None
    lease: float | None = None
    retention: float | None = None
    wait: float | None = None
    replay_headers: tuple[str, ...] = ()
    fingerprint_exclude: tuple[str, ...] = ()
    fingerprint_headers: tuple[str, ...] = ()
    principal: PrincipalResolver | str | None = None
    endpoint: str | None = None
    release: ReleasePredicate | str | None = None
    phases: tuple[str, ...] = ()
    using: str | Callable[[Any], str] | None = None
    key: KeyExtractor | str | None = None
    heartbeat: bool | None = None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> Options:
        """Build from decorator keyword arguments.

        Raises:
            TypeError: an unknown option name, or a duration that is not positive.
        """
        names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(
                f"Unknown idempotency option(s): {', '.join(sorted(unknown))}. "
                f"Known: {', '.join(sorted(names))}."
            )
        for name in ("lease", "retention"):
            value = kwargs.get(name)
            if value is not None and not float(value) > 0:
                raise TypeError(f"{name} must be a positive number of seconds, not {value!r}")
        lease, retention = kwargs.get("lease"), kwargs.get("retention")
        if lease is not None and retention is not None and float(lease) >= float(retention):
            raise TypeError(f"lease ({lease} s) must be shorter than retention ({retention} s)")
        if kwargs.get("wait") is not None and float(kwargs["wait"]) < 0:
            raise TypeError(f"wait must be 0 or more seconds, not {kwargs['wait']!r}")
        using = kwargs.get("using")
        if using is not None and not (isinstance(using, str) and using) and not callable(using):
            raise TypeError(f"using takes a database alias or a callable, not {using!r}")
        if "phases" in kwargs:
            kwargs["phases"] = validate_phases(kwargs["phases"])
        for name in ("replay_headers", "fingerprint_exclude", "fingerprint_headers"):
            if name in kwargs:
                value = kwargs[name]
                if isinstance(value, str):
                    raise TypeError(f"{name} takes a list of strings, not one string")
                kwargs[name] = tuple(value)
        forbidden = sorted(
            h for h in kwargs.get("replay_headers", ()) if h.lower() in FORBIDDEN_HEADERS
        )
        if forbidden:
            raise TypeError(
                f"replay_headers names headers that are never stored or replayed: "
                f"{', '.join(forbidden)} (credentials, cookies, hop-by-hop, tracing)"
            )
        return cls(**kwargs)

    def merged(self, other: Options) -> Options:
        """These options with ``other``'s non-default values on top."""
        values = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = theirs if theirs not in (None, ()) else mine
        return Options(**values)

    # Effective values: the view's choice, else the setting, read now.

    def get_required(self) -> bool:
        """Effective ``required``."""
        return conf.required if self.required is None else self.required

    def get_lease(self) -> float:
        """Effective lease, seconds."""
        return conf.lease if self.lease is None else float(self.lease)

    def get_retention(self) -> float:
        """Effective retention window, seconds."""
        return conf.retention if self.retention is None else float(self.retention)

    def get_wait(self) -> float:
        """Effective in-flight wait, seconds."""
        return conf.wait if self.wait is None else float(self.wait)

    def get_heartbeat(self) -> bool:
        """Effective ``heartbeat``: the view's choice, else the ``HEARTBEAT`` setting."""
        return conf.heartbeat if self.heartbeat is None else bool(self.heartbeat)

    def get_replay_headers(self) -> Iterable[str]:
        """Extra replayed headers: the setting's plus the view's."""
        return (*conf.replay_headers, *self.replay_headers)

    def get_fingerprint_exclude(self) -> Iterable[str]:
        """Fields left out of the fingerprint: the setting's plus the view's."""
        return (*conf.fingerprint_exclude, *self.fingerprint_exclude)

    def get_fingerprint_headers(self) -> Iterable[str]:
        """Headers in the fingerprint: the setting's plus the view's."""
        return (*conf.fingerprint_headers, *self.fingerprint_headers)

    def get_principal(self) -> PrincipalResolver:
        """Effective principal resolver (a callable, or a dotted path to one)."""
        if self.principal is None:
            return conf.principal_resolver
        resolver = resolve_callable(self.principal)
        assert resolver is not None
        return resolver

    def get_using(self, request: Any) -> str:
        """The alias of the database holding ``request``'s record (``databases.py``).

        Raises:
            django.core.exceptions.ImproperlyConfigured: the choice is not an alias in
                ``settings.DATABASES``.
        """
        return for_request(request, self.using)

    def get_key_extractor(self) -> KeyExtractor | None:
        """The view's key extractor (``key=``), or ``None``: the ``Idempotency-Key`` header."""
        return resolve_callable(self.key)

    def should_release(self, status: int) -> bool:
        """Whether a returned ``status`` releases the key instead of being stored.

        Default rule (docs/configuration.md): every 5xx and the ``RELEASE_STATUSES`` setting
        (408, 409, 425, 429). A view's ``release`` or the ``RELEASE_PREDICATE``
        setting replaces the rule.
        """
        predicate = resolve_callable(self.release) or conf.release_predicate
        if predicate is not None:
            return bool(predicate(status))
        return status >= 500 or status in conf.release_statuses
