"""The request fingerprint (SPEC §3): SHA-256 over what makes two requests "the same".

Inputs, in order, each framed by its length so no two inputs can run together:

1. a version tag (``fp1``), so a future change of scheme never matches an old hash;
2. the method, upper case;
3. the full path (``request.path``, including any script prefix);
4. the query string, parsed and sorted by (name, value), blanks kept; escapes are
   decoded byte for byte (Django decodes them with the request's charset, so two
   different byte strings must never look the same here);
5. the configured headers (``FINGERPRINT_HEADERS``), lower-cased name and value;
6. the body, by media type:

   * JSON (``application/json``, ``*/*+json``): decoded with the declared charset
     (default ``DEFAULT_CHARSET``), parsed and re-serialised canonically
     (keys sorted, compact separators, non-ASCII kept). Key order and white space do
     not matter; ``{}``, ``[]``, ``null`` and an absent field all stay distinct.
     Excluded fields (``FINGERPRINT_EXCLUDE``, dotted paths) are removed first.
     A body that is not valid JSON is hashed as raw bytes.
   * ``multipart/form-data`` and ``application/x-www-form-urlencoded``: the parsed
     fields, sorted, plus for each file its field name, file name, content type and
     SHA-256 of its bytes. The multipart boundary therefore never matters.
   * anything else: the raw bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.http import HttpRequest
from django.http.request import RawPostDataException

VERSION = b"fp1"
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def _media_type(request: HttpRequest) -> str:
    return (request.content_type or "").lower()


def is_json(media_type: str) -> bool:
    """Whether ``media_type`` (lower case, no parameters) is a JSON type (RFC 8259)."""
    return media_type == "application/json" or media_type.endswith("+json")


def _drop_path(obj: Any, path: Sequence[str]) -> None:
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        if rest:
            if head in obj:
                _drop_path(obj[head], rest)
        else:
            obj.pop(head, None)
    elif isinstance(obj, list) and head == "*" and rest:
        for item in obj:
            _drop_path(item, rest)


def canonical_json(data: Any, exclude: Iterable[str] = ()) -> bytes:
    """Canonical JSON bytes of parsed ``data``, after removing ``exclude`` paths.

    Args:
        data: a parsed JSON value (dicts, lists, str, int, float, bool, None). It is
            modified in place when ``exclude`` is not empty.
        exclude: dotted field paths such as ``"client_ts"`` or ``"meta.sent_at"``;
            ``*`` steps into every element of a list (``"items.*.nonce"``).

    Returns:
        UTF-8 bytes with sorted keys and no insignificant white space.
    """
    for path in exclude:
        _drop_path(data, path.split("."))
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True
    ).encode("utf-8", "surrogatepass")


def _file_digest(upload: Any) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def _form_parts(request: HttpRequest, exclude: Iterable[str]) -> list[bytes]:
    skip = set(exclude)
    fields = sorted(
        (name, value)
        for name, values in request.POST.lists()
        if name not in skip
        for value in values
    )
    files = sorted(
        (name, upload.name or "", upload.content_type or "", _file_digest(upload))
        for name, uploads in request.FILES.lists()
        if name not in skip
        for upload in uploads
    )
    return [b"form", json.dumps([fields, files]).encode("ascii")]


def _body_parts(request: HttpRequest, parsed: Any, exclude: Iterable[str]) -> list[bytes]:
    media_type = _media_type(request)
    if media_type in _FORM_TYPES:
        return _form_parts(request, exclude)
    try:
        body = request.body
    except RawPostDataException:
        # The stream was consumed by a parser (DRF) before we ran: use its result.
        if is_json(media_type) and parsed is not None:
            return [b"json", canonical_json(parsed, exclude)]
        raise
    if is_json(media_type) and body:
        try:
            # Decoded with the declared charset, as DRF's JSONParser does: the same
            # bytes sent as latin-1 and as UTF-8 are two different requests.
            data = json.loads(body.decode(request.encoding or settings.DEFAULT_CHARSET))
        except (ValueError, LookupError):
            return [b"raw", body]
        return [b"json", canonical_json(data, exclude)]
    return [b"raw", body]


def compute(
    request: HttpRequest,
    *,
    exclude: Iterable[str] = (),
    headers: Iterable[str] = (),
    parsed_body: Any = None,
) -> str:
    """Return the hex SHA-256 fingerprint of ``request``.

    Args:
        request: the Django ``HttpRequest`` (for DRF, ``request._request``).
        exclude: body fields left out (dotted paths, see :func:`canonical_json`).
        headers: request header names included in the hash, case-insensitive.
        parsed_body: an already parsed body (DRF's ``request.data``), used only when
            the raw stream was consumed before the fingerprint was taken.

    Returns:
        64 lower-case hex characters.

    Raises:
        django.http.request.RawPostDataException: the body was consumed and no parsed
            form of it is available.
        RecursionError: a JSON body nested too deeply for Python's ``json`` module.
        django.core.exceptions.RequestDataTooBig (and Django's other body errors):
            raised by ``request.body`` / ``request.POST`` while reading the body.
    """
    # Percent-escapes decoded as latin-1, one character per byte: two query strings
    # differ here whenever their bytes differ, whatever charset the view decodes with.
    query = sorted(
        parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=True, encoding="latin-1")
    )
    header_values = sorted((name.lower(), request.headers.get(name, "")) for name in headers)
    parts: list[bytes] = [
        VERSION,
        (request.method or "").upper().encode("ascii", "replace"),
        request.path.encode("utf-8", "surrogateescape"),
        json.dumps(query).encode("ascii"),
        json.dumps(header_values).encode("ascii"),
        *_body_parts(request, parsed_body, exclude),
    ]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
