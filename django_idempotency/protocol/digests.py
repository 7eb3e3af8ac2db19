"""The stored form of a request fingerprint: a digest of each part, and the parts that differ.

A fingerprint (docs/concepts.md, "Fingerprint") has five parts, in this order:
``method``, ``path``, ``query``, ``headers`` (those of ``FINGERPRINT_HEADERS``) and
``body`` (with its media type). Each part's inputs are hashed once, with SHA-256, each
input framed by its length. The stored value is ``fp2:`` and the base64url form
(unpadded) of 44 bytes:

* 24 bytes (192 bits) of SHA-256 over the version tag and the five part digests: the
  *whole*. Two fingerprints are equal exactly when their strings are equal, and the
  string holds the whole: two different requests compare equal with probability
  2^-192, and making two collide on purpose takes about 2^96 SHA-256 evaluations (the
  birthday bound), out of reach.
* then 4 bytes (32 bits) of each part's digest, in the order above: its *tag*. The tags
  are read only once two fingerprints differ, to name the parts that differ. Equal parts
  always have equal tags, so a part named always differs; a part that differs goes
  unnamed with probability 2^-32 (the problem then names the parts it can, or none).

63 ASCII characters in all, within the record's 64-character column. A stored value
without the ``fp2:`` prefix is of the earlier format, ``fp1`` (64 hex characters, one
SHA-256 over all the inputs, no parts): :meth:`Fingerprint.matches` compares it by that
scheme, and it names no parts.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

#: The parts of a fingerprint, in the order of their tags.
PARTS = ("method", "path", "query", "headers", "body")
PREFIX = "fp2:"
_WHOLE = 24  # bytes: 192 bits
_TAG = 4  # bytes of each part's digest: 32 bits
_BYTES = _WHOLE + _TAG * len(PARTS)
#: Characters of a stored fingerprint: the prefix and the unpadded base64url of the bytes.
LENGTH = len(PREFIX) + -(-_BYTES * 4 // 3)
_LEGACY_VERSION = b"fp1"
_PREFIX_BYTES = PREFIX.encode("ascii")
_sha256 = hashlib.sha256
_SMALL = 4096  # an input this long is copied once to be hashed in one call


class Fingerprint:
    """A request's fingerprint: the value the record stores, and what it was made of.

    Attributes:
        value: the stored form (``fp2:``, :data:`LENGTH` ASCII characters).
        inputs: each part's inputs, in the order of :data:`PARTS`; kept to compare the
            request with a record of the earlier format.
    """

    __slots__ = ("inputs", "value")

    def __init__(self, value: str, inputs: Sequence[Sequence[bytes]]) -> None:
        self.value = value
        self.inputs = inputs

    def __repr__(self) -> str:
        return f"Fingerprint({self.value!r})"

    def legacy(self) -> str:
        """The ``fp1`` value of the same request: 64 hex characters."""
        digest = _sha256()
        for item in (_LEGACY_VERSION, *(item for part in self.inputs for item in part)):
            digest.update(len(item).to_bytes(8, "big"))
            digest.update(item)
        return digest.hexdigest()

    def matches(self, stored: str) -> bool:
        """Whether ``stored`` (a record's fingerprint, of any format) is this request's."""
        if stored == self.value:
            return True
        if stored.startswith(PREFIX):
            return False
        return stored == self.legacy()


def seal(inputs: Sequence[Sequence[bytes]]) -> Fingerprint:
    """The fingerprint of a request whose parts have these inputs.

    Args:
        inputs: one sequence of byte strings per part, in the order of :data:`PARTS`.

    Returns:
        The :class:`Fingerprint`; each part hashed once.

    Raises:
        ValueError: not one sequence of inputs per part.
    """
    if len(inputs) != len(PARTS):
        raise ValueError(f"a fingerprint has {len(PARTS)} parts, not {len(inputs)}")
    raws = [_digest(part) for part in inputs]
    whole = _sha256(b"".join((_PREFIX_BYTES, *raws))).digest()
    packed = b"".join((whole[:_WHOLE], *(raw[:_TAG] for raw in raws)))
    return Fingerprint(PREFIX + _encode(packed), inputs)


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
    if len(value) != LENGTH or not value.startswith(PREFIX):
        return None
    text = value[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    return raw if len(raw) == _BYTES else None


def differing_parts(stored: str, value: str) -> tuple[str, ...]:
    """The names of the parts in which two fingerprints differ, in :data:`PARTS` order.

    Args:
        stored: a record's fingerprint, of any format.
        value: a request's (``Fingerprint.value``).

    Returns:
        The parts whose tags differ; empty when either value is not of the ``fp2``
        format (an earlier record) or when no tag tells (2^-32 per differing part).
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
