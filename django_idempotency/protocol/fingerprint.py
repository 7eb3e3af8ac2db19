"""The request fingerprint: what makes two requests "the same", by part.

The rules, and why, are in docs/concepts.md ("Fingerprint") and docs/protocol.md
("Numbers in JSON bodies"). The inputs below make five parts (``method``, ``path``,
``query``, ``headers``, ``body``: the body and its media type); each part is hashed
once, its inputs framed by their length so no two can run together, and ``digests``
seals the part digests into the stored value (``fp3:``, with a tag per part that names
the parts in which two requests differ).

Inputs, in order:

1. the method, upper case;
2. the full path (``request.path``, including any script prefix);
3. the query string, parsed and sorted by name (the values of a repeated name keep
   their order: Django and DRF take the last one), blanks kept; escapes are
   decoded byte for byte (Django decodes them with the request's charset, so two
   different byte strings must never look the same here);
4. the configured headers (``FINGERPRINT_HEADERS``), lower-cased name and value;
5. the body, by media type:

   * JSON (``application/json``, ``*/*+json``): decoded with the declared charset
     (default ``DEFAULT_CHARSET``), parsed and re-serialised canonically
     (keys sorted, compact separators, non-ASCII kept). Key order and white space do
     not matter; ``{}``, ``[]``, ``null`` and an absent field all stay distinct.
     Numbers count by their exact decimal value (``exact_json``): ``1e2`` is ``100``,
     ``100.10000000000000001`` is not ``100.1``.
     Excluded fields (``FINGERPRINT_EXCLUDE``, dotted paths) are removed first.
     A body that is not valid JSON is hashed as raw bytes.
   * ``multipart/form-data`` and ``application/x-www-form-urlencoded``, whatever the
     method: the parsed fields, sorted by name (repeated names keep their order), plus
     for each file its field name, file name, content type and SHA-256 of its bytes.
     The multipart boundary therefore never matters. The body stays readable by the
     view (``request.body``) when it fits ``DATA_UPLOAD_MAX_MEMORY_SIZE``; forms of
     methods other than POST must fit it (else 413).
   * anything else: the raw bytes.
   * no body at all: empty raw bytes, whatever its media type (an empty form too).
   * a body a parser consumed as a stream before the claim (DRF's CSRF check under
     session authentication parses it; DRF's JSON and form parsers keep the bytes in
     ``request.body``, so this is only for other parsers): the parser's result,
     canonically serialised, its floats counted as the decimals they print as (what
     the view sees, too).

   Form fields that carry a per-render token (``FINGERPRINT_FORM_TOKENS``, by default
   Django's ``csrfmiddlewaretoken``, masked afresh on every render) are left out of
   form bodies, like ``FINGERPRINT_EXCLUDE``'s fields.

   and, in the body's part, its media type (``type/subtype``, lower case, RFC 9110
   §8.3.1; parameters such as ``charset`` do not count, the JSON text is decoded with
   it already), unless the body is empty or the type is the one its kind implies:
   ``application/json`` for a JSON body, ``application/x-www-form-urlencoded`` for a
   form, none for raw bytes. The same bytes under another type are another request (a
   view's parser may refuse that type). Each input is framed by its length, so a body
   part with this input never hashes like one without it.

The stored value also holds a digest of the request with no body field left out
(neither ``FINGERPRINT_EXCLUDE`` nor ``FINGERPRINT_FORM_TOKENS``), so that a record
stored under one configuration still replays a byte-identical retry under another
(``store.fingerprints``).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.http import HttpRequest, QueryDict
from django.http.request import RawPostDataException
from django.utils.datastructures import MultiValueDict

from django_idempotency.protocol import exact_json
from django_idempotency.protocol.digests import Fingerprint, seal

_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
#: The media type each kind of body implies: a body of that kind under it has no media
#: type input (any other kind implies none: a raw body sent without ``Content-Type``).
_IMPLIED_TYPES = {b"json": "application/json", b"form": "application/x-www-form-urlencoded"}
#: The body input of an empty body, whatever its declared type.
_EMPTY = (b"raw", b"")


def _media_type(request: HttpRequest) -> str:
    """``type/subtype`` of the request's ``Content-Type``, lower case, no parameters."""
    return (request.content_type or "").strip().lower()


def _media_type_parts(body: list[bytes], media_type: str) -> list[bytes]:
    """The media type input: none for an empty body or the type its kind implies.

    An empty body has no media type that matters: DRF parses no empty body (whatever
    its ``Content-Type``), and clients differ in sending one with no body.
    """
    if media_type == _IMPLIED_TYPES.get(body[0], ""):
        return []
    if tuple(body) == _EMPTY:
        return []
    return [b"media-type", media_type.encode("utf-8", "surrogateescape")]


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


def canonical_json(
    data: Any, exclude: Iterable[str] = (), *, default: Callable[[Any], Any] | None = None
) -> bytes:
    """Canonical JSON bytes of parsed ``data``, after removing ``exclude`` paths.

    Args:
        data: a parsed JSON value (dicts, lists, str, int, float, ``Decimal``, bool,
            None). Never modified: exclusions apply to a copy (it may be the view's
            ``request.data``). Numbers count by value (``exact_json.canonical``): a
            float as the decimal its ``repr`` writes, a ``Decimal`` exactly.
        exclude: dotted field paths such as ``"client_ts"`` or ``"meta.sent_at"``;
            ``*`` steps into every element of a list (``"items.*.nonce"``).
        default: serialiser for values JSON does not know (see ``json.dumps``).

    Returns:
        UTF-8 bytes with sorted keys and no insignificant white space.
    """
    return _canonical(exact_json.canonical(data), exclude, default=default, copied=True)


def _canonical(
    data: Any,
    exclude: Iterable[str],
    *,
    default: Callable[[Any], Any] | None = None,
    copied: bool = False,
) -> bytes:
    """:func:`canonical_json` for data whose numbers are canonical already."""
    paths = [path.split(".") for path in exclude]
    if paths:
        if not copied:
            data = copy.deepcopy(data)
        for path in paths:
            _drop_path(data, path)
    return exact_json.dumps(data, default=default)


def _file_digest(upload: Any) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def _by_name(pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Pairs sorted by name only: the values of a repeated name keep their order.

    Django and DRF take the *last* value of a repeated field, so ``a=1&a=2`` and
    ``a=2&a=1`` are different requests; fields with different names commute.
    """
    return sorted(pairs, key=lambda pair: pair[0])


def _upload(upload: Any) -> list[str]:
    return [upload.name or "", upload.content_type or "", _file_digest(upload)]


def _form_parts(post: Any, files: Any, exclude: Iterable[str]) -> list[bytes]:
    return _form_input(*_form_lists(post, files), set(exclude))


def _form_lists(post: Any, files: Any) -> tuple[list[Any], list[Any]]:
    """Every field and every upload (its name, file name, type and digest), by name."""
    fields = _by_name((name, value) for name, values in post.lists() for value in values)
    uploads = _by_name((name, _upload(upload)) for name, items in files.lists() for upload in items)
    return fields, uploads


def _form_input(fields: list[Any], uploads: list[Any], skip: set[str]) -> list[bytes]:
    kept = [[pair for pair in pairs if pair[0] not in skip] for pairs in (fields, uploads)]
    return [b"form", json.dumps(kept).encode("ascii")]


def _form_body(request: HttpRequest) -> bytes | None:
    """The bytes of a form body, read now where the view can read them again.

    POST: ``request.body`` when it fits ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (cached on the
    request, so a view may still read it), else ``None``: Django streams it. Other
    methods: ``request.body`` (Django parses form bodies of POST only).
    """
    if request.method == "POST":
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if getattr(request, "_read_started", False) or (limit is not None and length > limit):
            return getattr(request, "_body", None)
    return request.body


def _parse_form(request: HttpRequest, media_type: str, body: bytes | None) -> tuple[Any, Any]:
    """The fields and files of a form body (``body``: :func:`_form_body`'s).

    POST: Django's own ``request.POST`` / ``FILES``, parsed from the body read first
    when it fits, else streamed as Django does. Other methods: a copy of the body is
    parsed here.
    """
    if request.method == "POST":
        return request.POST, request.FILES
    body = request.body if body is None else body
    if media_type == "application/x-www-form-urlencoded":
        return QueryDict(body, encoding=request.encoding), MultiValueDict()
    return request.parse_file_upload(request.META, io.BytesIO(body))


def _loaded_form(request: HttpRequest, media_type: str) -> tuple[Any, Any] | None:
    """(fields, files) a middleware parsed from a form body it consumed, else ``None``.

    Django parses the form bodies of POST only; Django Ninja's
    ``fix_request_files_middleware`` parses those of PUT and PATCH too (filling
    ``request.POST`` and ``request.FILES``), which consumes the stream. What it parsed
    is the body: the same fields and files give the same parts as a POST's. An empty
    result tells nothing (the stream may have been read by someone else): ``None``.
    """
    if media_type not in _FORM_TYPES:
        return None
    post, files = request.POST, request.FILES
    return (post, files) if post or files else None


def _json_default(value: Any) -> Any:
    if hasattr(value, "chunks") and hasattr(value, "seek"):  # an uploaded file
        return _upload(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _parsed_parts(
    parsed: Any, media_type: str, exclude: Iterable[str], form_exclude: Iterable[str]
) -> list[bytes]:
    """Parts for a body a parser (DRF) consumed before the fingerprint was taken."""
    if hasattr(parsed, "lists"):  # QueryDict / MultiValueDict: fields, maybe files
        post: MultiValueDict[str, Any] = MultiValueDict()
        files: MultiValueDict[str, Any] = MultiValueDict()
        for name, values in parsed.lists():
            for value in values:
                target = files if hasattr(value, "chunks") else post
                target.appendlist(name, value)
        form = _form_parts(post, files, (*exclude, *form_exclude))
        return form if media_type in _FORM_TYPES else [b"parsed-form", form[1]]
    if is_json(media_type):
        return [b"json", canonical_json(parsed, exclude)]
    return [b"parsed", canonical_json(parsed, exclude, default=_json_default)]


def _body_parts(
    request: HttpRequest,
    parsed: Any,
    exclude: Iterable[str],
    form_exclude: Iterable[str] = (),
    media_type: str | None = None,
) -> list[bytes]:
    """The body part's inputs (without its media type), fields left out."""
    return _body_inputs(request, parsed, exclude, form_exclude, media_type)[0]


def _body_inputs(
    request: HttpRequest,
    parsed: Any,
    exclude: Iterable[str],
    form_exclude: Iterable[str] = (),
    media_type: str | None = None,
) -> tuple[list[bytes], list[bytes] | None]:
    """The body part's inputs, and those of the body as sent (``None``: the same).

    The second leaves no field out (neither ``exclude`` nor ``form_exclude``): a
    byte-identical retry has the same whatever the configuration (``store.fingerprints``).
    """
    if media_type is None:
        media_type = _media_type(request)
    exclude, form_exclude = tuple(exclude), tuple(form_exclude)
    try:
        if media_type in _FORM_TYPES:
            form_body = _form_body(request)
            if form_body == b"":  # no body: the same request whatever its media type
                return list(_EMPTY), None
            fields, uploads = _form_lists(*_parse_form(request, media_type, form_body))
            skip = {*exclude, *form_exclude}
            form = _form_input(fields, uploads, skip)
            if not any(pair[0] in skip for pairs in (fields, uploads) for pair in pairs):
                return form, None
            return form, _form_input(fields, uploads, set())  # files hashed once
        body = request.body
    except RawPostDataException:
        # The stream was consumed by a parser (DRF) before we ran: use its result.
        if parsed is None:
            loaded = _loaded_form(request, media_type)
            if loaded is None:
                raise
            left_out = (*exclude, *form_exclude)
            sent = _form_parts(*loaded, ()) if left_out else None
            return _form_parts(*loaded, left_out), sent
        parts = _parsed_parts(parsed, media_type, exclude, form_exclude)
        if not exclude and not form_exclude:
            return parts, None
        return parts, _parsed_parts(parsed, media_type, (), ())
    if is_json(media_type) and body:
        try:
            # Decoded with the declared charset, as DRF's JSONParser does: the same
            # bytes sent as latin-1 and as UTF-8 are two different requests.
            text = body.decode(request.encoding or settings.DEFAULT_CHARSET)
            data = exact_json.loads(text)  # numbers by their exact decimal value
        except (ValueError, LookupError):
            return [b"raw", body], None
        if not exclude:
            return [b"json", exact_json.dumps(data)], None
        sent = [b"json", exact_json.dumps(data)]
        # Parsed here, so nothing else holds ``data``: exclusions need no copy.
        return [b"json", _canonical(data, exclude, copied=True)], sent
    return [b"raw", body], None


def compute(
    request: HttpRequest,
    *,
    exclude: Iterable[str] = (),
    headers: Iterable[str] = (),
    parsed_body: Any = None,
    form_exclude: Iterable[str] = (),
) -> str:
    """Return the stored form of ``request``'s fingerprint: :func:`take`'s ``value``."""
    return take(
        request,
        exclude=exclude,
        headers=headers,
        parsed_body=parsed_body,
        form_exclude=form_exclude,
    ).value


def take(
    request: HttpRequest,
    *,
    exclude: Iterable[str] = (),
    headers: Iterable[str] = (),
    parsed_body: Any = None,
    form_exclude: Iterable[str] = (),
) -> Fingerprint:
    """Return the fingerprint of ``request``, each of its parts hashed once.

    Args:
        request: the Django ``HttpRequest`` (for DRF, ``request._request``).
        exclude: body fields left out (dotted paths, see :func:`canonical_json`).
        form_exclude: field names left out of form bodies only (the per-render tokens
            of ``FINGERPRINT_FORM_TOKENS``); JSON bodies keep fields of these names.
        headers: request header names included in the hash, case-insensitive.
        parsed_body: an already parsed body (DRF's ``request.data``), used only when
            the raw stream was consumed before the fingerprint was taken.

    Returns:
        The :class:`~django_idempotency.protocol.digests.Fingerprint`: its ``value``
        is what the record stores (``digests.LENGTH`` ASCII characters, ``fp3:``):
        the digests of these inputs, and of the body as sent, with nothing left out.

    Raises:
        django.http.request.RawPostDataException: the body was consumed and no parsed
            form of it is available.
        RecursionError: a JSON body nested too deeply for Python's ``json`` module.
        django.core.exceptions.RequestDataTooBig (and Django's other body errors):
            raised by ``request.body`` / ``request.POST`` while reading the body.
    """
    # Percent-escapes decoded as latin-1, one character per byte: two query strings
    # differ here whenever their bytes differ, whatever charset the view decodes with.
    query = _by_name(
        parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=True, encoding="latin-1")
    )
    headers = tuple(headers)
    header_values = sorted((name.lower(), request.headers.get(name, "")) for name in headers)
    media_type = _media_type(request)
    body, sent = _body_inputs(request, parsed_body, exclude, form_exclude, media_type)
    return seal(
        (
            ((request.method or "").upper().encode("ascii", "replace"),),
            (request.path.encode("utf-8", "surrogateescape"),),
            (json.dumps(query).encode("ascii"),),
            (json.dumps(header_values).encode("ascii"),),
            (
                *body,
                *_media_type_parts(body, media_type),
            ),
        ),
        raw_body=None if sent is None else (*sent, *_media_type_parts(sent, media_type)),
        header_names=headers,
    )
