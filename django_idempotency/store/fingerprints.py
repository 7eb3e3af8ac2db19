"""When a stored fingerprint and a request's are the same request.

A request fingerprint (``protocol.digests``) is ``fp3:`` and four segments joined by
``.``, each the unpadded base64url form of some bytes:

1. ``whole``: 24 bytes (192 bits) over the five configured parts (method, path, query,
   the ``FINGERPRINT_HEADERS``, the body less ``FINGERPRINT_EXCLUDE``), then a 4-byte
   tag per part (59 characters);
2. ``raw``: 24 bytes over the method, path, query and the body as sent (no field left
   out), no header (32 characters);
3. ``raw_headers``: 24 bytes over the same and the configured headers (32 characters);
4. ``header_names``: 6 bytes over the names of the configured headers (8 characters).

A record matches a request (:func:`same_request`) when

* the ``whole`` is equal: the same request under the configuration in force; or
* ``raw_headers`` is equal: byte for byte the same body, with the same configured
  headers, whatever fields the configuration leaves out now or left out then; or
* the header names differ (the record was stored under another ``FINGERPRINT_HEADERS``
  or ``fingerprint_headers=``) and ``raw`` is equal: byte for byte the same body; the
  headers of such a record cannot be compared, since it holds none of the new ones.

So a change of the fingerprint settings never turns a byte-identical retry into a 422,
while a request with another body, or (under the same header names) other header
values, still gets one. Any other stored value (a payload fingerprint of ``inbox``, 64
hex characters) matches only itself. ``store.claims.judge`` applies the rule, in Python
only.
"""

from __future__ import annotations

PREFIX = "fp3:"
SEPARATOR = "."
#: Characters of the ``whole`` digest after the prefix (24 bytes in base64url).
WHOLE_CHARS = 32
#: Characters of a stored fingerprint: the record's column holds at most this many.
MAX_LENGTH = 160


def _segments(value: str) -> list[str] | None:
    if not value.startswith(PREFIX):
        return None
    segments = value[len(PREFIX) :].split(SEPARATOR)
    return segments if len(segments) == 4 and all(segments) else None


def same_request(stored: str, value: str) -> bool:
    """Whether a record's fingerprint ``stored`` and a request's ``value`` are one request.

    Args:
        stored: the record's fingerprint column.
        value: the request's fingerprint (or a payload fingerprint of ``inbox``).

    Returns:
        ``True`` when equal, or when both are ``fp3:`` fingerprints that match by the
        rule of this module's docstring.
    """
    if stored == value:
        return True
    first, second = _segments(stored), _segments(value)
    if first is None or second is None:
        return False
    return (
        first[0][:WHOLE_CHARS] == second[0][:WHOLE_CHARS]
        or first[2] == second[2]
        or (first[3] != second[3] and first[1] == second[1])
    )
