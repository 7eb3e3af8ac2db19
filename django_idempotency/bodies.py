"""How response bodies are stored: the size limit and the optional codec.

``encode_body`` is what the completion writes, ``decode_body`` what a replay (and the
admin) reads back; ``MAX_RESPONSE_BYTES`` and ``BODY_CODEC`` are described in
docs/robustness.md and docs/security.md.
"""

from __future__ import annotations

from django_idempotency.conf import conf


def encode_body(body: bytes) -> bytes | None:
    """What :func:`complete` writes as ``response_body`` for a response body.

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
