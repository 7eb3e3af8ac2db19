"""The stored form of a request fingerprint: a digest of each part, and the parts that differ.

A fingerprint (docs/concepts.md, "Fingerprint") has five parts, in this order:
``method``, ``path``, ``query``, ``headers`` (those of ``FINGERPRINT_HEADERS``) and
``body`` (with its media type). Each part's inputs are hashed once, with SHA-256, each
input framed by its length. The stored value is ``fp3:`` and four segments joined by
``.``, each unpadded base64url (the layout, and when a record matches a request, are in
``store.fingerprints``):

* ``whole``: 24 bytes (192 bits) of SHA-256 over the version tag and the five part
  digests, then 4 bytes (32 bits) of each part's digest, in the order above: its *tag*.
  Two requests with the same configured inputs have the same whole; two different ones
  the same with probability 2^-192, and making two collide on purpose takes about 2^96
  SHA-256 evaluations (the birthday bound), out of reach. The tags are read only once
  two fingerprints differ, to name the parts that differ. Equal parts always have equal
  tags, so a part named always differs; a part that differs goes unnamed with
  probability 2^-32 (the problem then names the parts it can, or none).
* ``raw``: 24 bytes over the method, path and query digests and the digest of the body
  as sent (no field left out): what stays the same when the fingerprint settings change.
* ``raw_headers``: 24 bytes over the same and the headers part.
* ``header_names``: 6 bytes over the configured header names, lower case.

138 ASCII characters in all, within the record's 160-character column.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence

from django_idempotency.store.fingerprints import PREFIX, SEPARATOR

#: The parts of a fingerprint, in the order of their tags.
PARTS = ("method", "path", "query", "headers", "body")
_WHOLE = 24  # bytes: 192 bits
_TAG = 4  # bytes of each part's digest: 32 bits
_RAW = 24  # bytes of each raw digest
_NAMES = 6  # bytes of the header names' digest
_BYTES = _WHOLE + _TAG * len(PARTS)


def _chars(size: int) -> int:
    return -(-size * 4 // 3)


#: Characters of a stored fingerprint: the prefix, the four segments, three separators.
LENGTH = len(PREFIX) + _chars(_BYTES) + 2 * _chars(_RAW) + _chars(_NAMES) + 3
_PREFIX_BYTES = PREFIX.encode("ascii")
_sha256 = hashlib.sha256
_SMALL = 4096  # an input this long is copied once to be hashed in one call


class Fingerprint:
    """A request's fingerprint: the value the record stores.

    Attributes:
        value: the stored form (``fp3:``, :data:`LENGTH` ASCII characters).
    """

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Fingerprint({self.value!r})"


def seal(
    inputs: Sequence[Sequence[bytes]],
    raw_body: Sequence[bytes] | None = None,
    header_names: Iterable[str] = (),
) -> Fingerprint:
    """The fingerprint of a request whose parts have these inputs.

    Args:
        inputs: one sequence of byte strings per part, in the order of :data:`PARTS`,
            as the configuration makes them (fields left out, headers chosen).
        raw_body: the body part's inputs with no field left out; ``None`` when they
            are the body part's of ``inputs``.
        header_names: the configured header names (the headers part's), any case.

    Returns:
        The :class:`Fingerprint`; each part hashed once.

    Raises:
        ValueError: not one sequence of inputs per part.
    """
    if len(inputs) != len(PARTS):
        raise ValueError(f"a fingerprint has {len(PARTS)} parts, not {len(inputs)}")
    raws = [_digest(part) for part in inputs]
    body = raws[4] if raw_body is None else _digest(raw_body)
    whole = _sha256(b"".join((_PREFIX_BYTES, *raws))).digest()
    packed = b"".join((whole[:_WHOLE], *(raw[:_TAG] for raw in raws)))
    raw = _sha256(b"".join((_PREFIX_BYTES, b"raw", *raws[:3], body))).digest()
    with_headers = _sha256(b"".join((_PREFIX_BYTES, b"raw-headers", *raws[:4], body))).digest()
    names = json.dumps(sorted(name.lower() for name in header_names)).encode("ascii", "replace")
    named = _sha256(b"".join((_PREFIX_BYTES, b"header-names", names))).digest()
    segments = (packed, raw[:_RAW], with_headers[:_RAW], named[:_NAMES])
    return Fingerprint(PREFIX + SEPARATOR.join(_encode(segment) for segment in segments))


def _digest(part: Sequence[bytes]) -> bytes:
    """SHA-256 of a part's inputs, each framed by its length (8 bytes, big-endian)."""
    if len(part) == 1 and len(part[0]) <= _SMALL:  # one short input: one call
        return _sha256(len(part[0]).to_bytes(8, "big") + part[0]).digest()
    digest = _sha256()
    for item in part:
        digest.update(len(item).to_bytes(8, "big"))
        digest.update(item)
    return digest.digest()


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode(value: str) -> bytes | None:
    """The ``whole`` segment's bytes (the whole digest and the tags), or ``None``."""
    if len(value) != LENGTH or not value.startswith(PREFIX):
        return None
    text = value[len(PREFIX) :].split(SEPARATOR, 1)[0]
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    return raw if len(raw) == _BYTES else None


def differing_parts(stored: str, value: str) -> tuple[str, ...]:
    """The names of the parts in which two fingerprints differ, in :data:`PARTS` order.

    Args:
        stored: a record's fingerprint.
        value: a request's (``Fingerprint.value``).

    Returns:
        The parts whose tags differ; empty when either value is not a request
        fingerprint (``fp3:``) or when no tag tells (2^-32 per differing part).
    """
    first, second = _decode(stored), _decode(value)
    if first is None or second is None:
        return ()
    return tuple(
        name
        for index, name in enumerate(PARTS)
        if first[_WHOLE + index * _TAG : _WHOLE + (index + 1) * _TAG]
        != second[_WHOLE + index * _TAG : _WHOLE + (index + 1) * _TAG]
    )
