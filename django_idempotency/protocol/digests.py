"""The stored form of a request fingerprint: a digest of each part, and the parts that differ.

A fingerprint (docs/concepts.md, "Fingerprint") has five parts, in this order:
``method``, ``path``, ``query``, ``headers`` (those of ``FINGERPRINT_HEADERS``) and
``body`` (with its media type). Each part's inputs are hashed once, with SHA-256, each
input framed by its length. The stored value is::

    fp2:<whole><method tag><path tag><query tag><headers tag><body tag>

* ``whole``: 32 base64url characters, the first 192 bits of SHA-256 over the version
  tag and the five part digests. Two fingerprints are equal exactly when their strings
  are equal, and the string holds ``whole``: two different requests compare equal with
  probability 2^-192, and making two collide on purpose takes about 2^96 SHA-256
  evaluations (the birthday bound), out of reach.
* each tag: 5 base64url characters, the first 30 bits of that part's digest. The tags
  are read only once two fingerprints differ, to name the parts that differ. Equal parts
  always have equal tags, so a part named always differs; a part that differs goes
  unnamed with probability 2^-30 (the problem then names the parts it can, or none).

61 ASCII characters in all, within the record's 64-character column. A stored value
without the ``fp2:`` prefix is of the earlier format, ``fp1`` (64 hex characters, one
SHA-256 over all the inputs, no parts): :meth:`Fingerprint.matches` compares it by that
scheme, and it names no parts.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: The parts of a fingerprint, in the order of their tags.
PARTS = ("method", "path", "query", "headers", "body")
PREFIX = "fp2:"
_WHOLE_BYTES = 24  # 192 bits: 32 base64url characters
_TAG_CHARS = 5  # 30 bits of each part's digest
_TAGS_AT = len(PREFIX) + _WHOLE_BYTES * 4 // 3
LENGTH = _TAGS_AT + _TAG_CHARS * len(PARTS)
_LEGACY_VERSION = b"fp1"


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _framed(digest: _Hash, inputs: Sequence[bytes]) -> None:
    for item in inputs:
        digest.update(len(item).to_bytes(8, "big"))
        digest.update(item)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


@dataclass(frozen=True, eq=False)
class Fingerprint:
    """A request's fingerprint: the value the record stores, and what it was made of.

    Attributes:
        value: the stored form (``fp2:``, :data:`LENGTH` ASCII characters).
        inputs: each part's inputs, in the order of :data:`PARTS`; kept to compare the
            request with a record of the earlier format.
    """

    value: str
    inputs: tuple[tuple[bytes, ...], ...]

    def legacy(self) -> str:
        """The ``fp1`` value of the same request: 64 hex characters."""
        digest = hashlib.sha256()
        _framed(digest, (_LEGACY_VERSION, *(item for part in self.inputs for item in part)))
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
    whole = hashlib.sha256(PREFIX.encode("ascii"))
    tags = []
    for part in inputs:
        digest = hashlib.sha256()
        _framed(digest, part)
        raw = digest.digest()
        whole.update(raw)
        tags.append(_b64(raw[:4])[:_TAG_CHARS])
    value = PREFIX + _b64(whole.digest()[:_WHOLE_BYTES]) + "".join(tags)
    return Fingerprint(value, tuple(tuple(part) for part in inputs))


def differing_parts(stored: str, value: str) -> tuple[str, ...]:
    """The names of the parts in which two fingerprints differ, in :data:`PARTS` order.

    Args:
        stored: a record's fingerprint, of any format.
        value: a request's (``Fingerprint.value``).

    Returns:
        The parts whose tags differ; empty when either value is not of the ``fp2``
        format (an earlier record) or when no tag tells (2^-30 per differing part).
    """
    if not (
        len(stored) == len(value) == LENGTH
        and stored.startswith(PREFIX)
        and value.startswith(PREFIX)
    ):
        return ()
    return tuple(
        name
        for index, name in enumerate(PARTS)
        if stored[_TAGS_AT + index * _TAG_CHARS : _TAGS_AT + (index + 1) * _TAG_CHARS]
        != value[_TAGS_AT + index * _TAG_CHARS : _TAGS_AT + (index + 1) * _TAG_CHARS]
    )
