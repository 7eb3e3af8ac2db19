"""What the store hands out and takes in: scopes, claims, stored responses, bodies.

Plain values, no SQL: the store makes and reads them, the protocol passes them on
(docs/concepts.md). Also how a response body is stored: :func:`encode_body` is what the
completion writes, :func:`decode_body` what a replay (and the admin) reads back;
``MAX_RESPONSE_BYTES`` and ``BODY_CODEC`` are described in docs/robustness.md and
docs/security.md.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django_idempotency.conf import conf
from django_idempotency.models import RecordState

Headers = list[tuple[str, str]]

#: Why a claim was taken over (``Claim.takeover_cause``; docs/observability.md).
#: The earlier owner's database session ended while its lease was live (owner presence).
BY_PRESENCE = "presence"
#: The earlier attempt's lease ran out (it crashed, stalled, or ended its lease itself
#: when it failed after a phase).
BY_LEASE = "lease"
#: An operator ended the earlier attempt's lease (``operators.end_leases``, the admin).
BY_OPERATOR = "operator"


@dataclass(frozen=True)
class Scope:
    """What identifies a record: the principal, the endpoint and the key (docs/protocol.md)."""

    principal: str
    endpoint: str
    key: str


@dataclass(frozen=True)
class StoredResponse:
    """A response as stored: status, replayable headers (name, value) and body bytes.

    ``replayable`` is ``False`` for a completed response whose body was longer than
    ``MAX_RESPONSE_BYTES``: only its status and headers were kept (``body`` is empty).
    """

    status: int
    headers: Headers
    body: bytes
    replayable: bool = True


@dataclass(frozen=True)
class Claim:
    """Ownership of a key: this request may execute the view.

    ``taken_over`` is true when the expired lease of an earlier attempt was taken
    over; ``recovery_point`` is then the last phase that attempt finished (docs/phases.md).
    ``using`` is the database alias of the record; ``committed`` is false when the
    claim was made inside a caller's transaction and is not yet visible to others.
    ``lease`` is the claim's lease in seconds: a completed response stays replayable
    at least that long after its completion commits. ``present``: this request's
    database session holds the record's presence lock (PostgreSQL, a direct
    connection); ``by_presence``: ``taken_over`` without waiting for the lease, because
    the earlier owner's session was gone (docs/robustness.md#owner-presence).
    ``takeover_cause``: why the claim was taken
    over (:data:`BY_PRESENCE`, :data:`BY_LEASE` or :data:`BY_OPERATOR`), as the claim's
    statement found it; ``""`` for a claim that took over nothing.
    """

    scope: Scope
    record_id: int
    owner_token: uuid.UUID
    taken_over: bool
    recovery_point: str
    using: str
    committed: bool = True
    lease: float = 0.0
    present: bool = False
    by_presence: bool = False
    takeover_cause: str = ""


@dataclass(frozen=True)
class Existing:
    """A record this request collided with, judged by the store's clock.

    ``lease_remaining`` is in seconds (negative once the lease ran out); ``expired``
    says the retention window is over; ``response`` is set once completed.
    ``owner_pid`` is set when the owner's session held the presence lock when it
    claimed; ``owner_gone``: that lock was free when the record was read, so the
    owner's session has ended (PostgreSQL; ``False`` wherever presence is not tested).
    ``ended_by_operator``: an operator ended the claim's lease (``operators.end_leases``).
    ``age``: seconds since the record was claimed; ``window``: seconds from its claim to
    the end of its retention window (``None`` where unknown).
    """

    record_id: int
    state: str
    fingerprint: str
    lease_remaining: float
    expired: bool
    response: StoredResponse | None
    owner_token: uuid.UUID | None = None
    recovery_point: str = ""
    owner_pid: int | None = None
    owner_gone: bool = False
    ended_by_operator: bool = False
    age: float | None = None
    window: float | None = None

    @property
    def completed(self) -> bool:
        """Whether the record holds a stored response."""
        return self.state == RecordState.COMPLETED


def encode_body(body: bytes) -> bytes | None:
    """What the completion writes as ``response_body`` for a response body.

    ``None`` (SQL NULL: not replayable) when ``body`` is longer than the
    ``MAX_RESPONSE_BYTES`` setting, else ``body`` passed through ``BODY_CODEC``'s
    ``encode`` (unchanged without a codec). The limit applies to the plain body.
    """
    limit = conf.max_response_bytes
    if limit is not None and len(body) > limit:
        return None
    codec = conf.body_codec
    return body if codec is None else bytes(codec.encode(body))


def decode_body(stored: bytes | memoryview) -> bytes:
    """A stored ``response_body`` as the view returned it: ``BODY_CODEC``'s ``decode``.

    Raises:
        Whatever the codec raises for data it cannot decode (e.g. a removed key).
    """
    codec = conf.body_codec
    data = bytes(stored)
    return data if codec is None else bytes(codec.decode(data))
