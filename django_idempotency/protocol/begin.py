"""Request in, decision out: the key, the principal, the scope and the fingerprint.

:func:`begin` reads the key (the header or the view's ``key=`` extractor), resolves
the principal and the endpoint (the scope), fingerprints the request and hands the
claim to ``decide``. Bad input is answered here, as problem+json, before anything is
claimed: 400 for a missing or malformed key or an unreadable body, 401/403 without a
principal. The order of the decisions is documented in docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException
from django.utils.encoding import escape_uri_path

from django_idempotency import store, transactions
from django_idempotency.conf import conf
from django_idempotency.exceptions import InvalidKey, SignatureRefused
from django_idempotency.protocol import fingerprint, keys, problems
from django_idempotency.protocol.context import running
from django_idempotency.protocol.decide import decide, key_name
from django_idempotency.protocol.decisions import (
    BYPASS,
    Bypass,
    CannotRun,
    Nested,
    Proceed,
    Respond,
    problem,
)
from django_idempotency.protocol.digests import Fingerprint
from django_idempotency.protocol.keys import HEADER, parse_key
from django_idempotency.protocol.options import Options

logger = logging.getLogger("django_idempotency")


#: Never recorded, key or not (RFC 9110 §9.2.1).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


_COLUMN = 255


def fit(value: str) -> str:
    """``value`` if it fits the 255-character columns, else a stable shortened form."""
    if len(value) <= _COLUMN:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{value[: _COLUMN - 66]}~{digest}"


def request_path(http: HttpRequest) -> str:
    """The path ``http`` was sent to, as kept with its record for operators.

    Percent-encoded (RFC 3986 section 2.1, Django's ``escape_uri_path``), so every
    character can be stored and shown as sent, and cut to the 255-character column
    (ending in ``...`` when cut). The query string and the body are never kept.
    """
    path = escape_uri_path(http.path)
    return path if len(path) <= _COLUMN else f"{path[: _COLUMN - 3]}..."


_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>(?:[^()]|\([^()]*\))*\)")


def normalise_route(route: str) -> str:
    """A URL pattern in the ``/v1/workers/{id}/reboot`` form (docs/concepts.md).

    ``<int:pk>`` (``path()``) and ``(?P<pk>[^/.]+)`` (``re_path()``, DRF routers)
    both become ``{pk}``; regex anchors and a leading slash are dropped.
    """
    route = _CONVERTER.sub(r"{\1}", _NAMED_GROUP.sub(r"{\1}", route))
    return route.lstrip("^").rstrip("$").lstrip("/")


def endpoint_for(request: HttpRequest, options: Options, view_name: str) -> str:
    """The endpoint of ``request``: ``"METHOD /route"`` (docs/concepts.md).

    The route is the URL pattern that matched, normalised (``v1/workers/{pk}/reboot``),
    so one view serving many resources is one endpoint; the fingerprint tells the
    resources apart. Without a resolver match (a view called directly), the view's
    dotted name stands in for the route. ``options.endpoint`` overrides both.
    """
    if options.endpoint:
        return fit(options.endpoint)
    match = getattr(request, "resolver_match", None)
    route = getattr(match, "route", None)
    route = normalise_route(route) if route else view_name
    return fit(f"{(request.method or '').upper()} /{route}")


def _fingerprint(request: Any, http: HttpRequest, options: Options) -> Fingerprint | Respond:
    parsed = None
    if http is not request and getattr(http, "_read_started", False) and not hasattr(http, "_body"):
        parsed = request.data  # DRF consumed the stream before us
    try:
        return fingerprint.take(
            http,
            exclude=options.get_fingerprint_exclude(),
            headers=options.get_fingerprint_headers(),
            parsed_body=parsed,
            form_exclude=conf.fingerprint_form_tokens,
        )
    except RequestDataTooBig:
        return problem(
            problems.BODY_TOO_LARGE,
            "The request body exceeds this server's size limit; nothing was done.",
        )
    except (
        MultiPartParserError,
        TooManyFieldsSent,
        TooManyFilesSent,
        UnreadablePostError,
        RawPostDataException,
    ) as exc:
        return problem(
            problems.UNREADABLE_BODY,
            f"The request body could not be read ({type(exc).__name__}); nothing was "
            "done. Check its Content-Type and encoding, then retry with the same key.",
        )
    except RecursionError:  # json.loads / json.dumps on absurdly deep nesting
        return problem(
            problems.UNREADABLE_BODY,
            "The JSON request body is nested too deeply to be read; nothing was done. "
            "Flatten it, then retry.",
        )


def _no_principal(request: Any, options: Options) -> Respond:
    """401 with the view's ``WWW-Authenticate`` challenge (DRF), else 403, as DRF does."""
    challenge = None
    for authenticator in getattr(request, "authenticators", None) or ():
        challenge = authenticator.authenticate_header(request)
        if challenge:
            break
    detail = (
        f"Requests with an {key_name(options)} must be authenticated, so that one "
        "client's key never collides with another's. Authenticate and retry."
    )
    if not challenge:
        return problem(problems.NO_PRINCIPAL_FORBIDDEN, detail)
    respond = problem(problems.NO_PRINCIPAL, detail)
    respond.response["WWW-Authenticate"] = challenge
    return respond


def _key(request: Any, http: HttpRequest, options: Options) -> str | Respond | Bypass:
    """The request's idempotency key: the header, or the view's ``key=`` extractor.

    Without the header, the field of a DRF browsable API form (``keys.form_key``).
    """
    extractor = options.get_key_extractor()
    max_length = min(conf.max_key_length, _COLUMN)
    try:
        if extractor is None:
            key = parse_key(http.headers.get(HEADER), max_length=max_length)
            if key is None:  # the browsable API's HTML form carries it in a field
                key = keys.form_key(request, http, max_length=max_length)
        else:
            key = keys.extract(extractor, request, max_length=max_length)
    except InvalidKey as exc:
        kind = problems.INVALID_KEY if extractor is None else problems.INVALID_EXTRACTED_KEY
        return problem(kind, str(exc))
    if key is not None:
        return key
    if not options.get_required():
        return BYPASS
    if extractor is not None:
        return problem(
            problems.MISSING_EXTRACTED_KEY,
            f"This endpoint takes its idempotency key from {keys.source(extractor)}, "
            "which the request does not carry.",
        )
    return problem(
        problems.MISSING_KEY,
        f"This endpoint requires an {HEADER} header. Generate one key (a UUID) "
        "per operation and send the same key on every retry of it.",
    )


def begin(
    request: Any, options: Options, *, view_name: str, may_run: bool = True
) -> Bypass | Respond | Proceed | Nested | CannotRun:
    """Decide what to do with ``request`` before the view runs.

    Args:
        request: a Django ``HttpRequest`` or a DRF ``Request`` (authenticated).
        options: the view's options.
        view_name: dotted name of the view, the endpoint when no route matched.
        may_run: ``False`` when the view cannot run for this request (DRF found no
            renderer for its ``Accept``): the key is only looked up, never claimed.
            A replay, a 409 or a 422 is answered as usual; where the view would
            have to run, :data:`CANNOT_RUN` is returned.

    Returns:
        :class:`Bypass`, :class:`Respond` (replay or problem+json), :class:`Proceed`
        with a claim, :class:`Nested` when the scope is the one the running idempotent
        view (or ``inbox.once`` block) on the same database claimed, or
        :class:`CannotRun`. Never raises for a client mistake; a
        failing store gives a 503 (fail closed: the view does not run without a claim).

    Warns:
        exceptions.OuterTransactionWarning: the claim is made inside an ``atomic()``
            block the app did not open (once per endpoint per process, docs/faq.md).
    """
    http: HttpRequest = getattr(request, "_request", request)
    if (http.method or "").upper() in SAFE_METHODS:
        return BYPASS
    key = _key(request, http, options)
    if not isinstance(key, str):
        return key
    try:
        principal = options.get_principal()(request)
    except SignatureRefused as refused:  # a signed sender's resolver (principals.py)
        return problem(problems.INVALID_SIGNATURE, str(refused))
    if not principal:
        return _no_principal(request, options)
    scope = store.Scope(fit(str(principal)), endpoint_for(http, options, view_name), key)
    using = options.get_using(request)
    outer = running(scope, using, request)
    if outer is not None:  # called by the running view with its scope: no second claim
        return Nested(outer)
    fp = _fingerprint(request, http, options)
    if isinstance(fp, Respond):
        return fp
    if may_run and transactions.outer_block(using):  # the claim could not commit on its own
        transactions.warn_outer(scope.endpoint, view_name, using)
    return decide(
        scope,
        fp,
        options,
        using,
        may_run=may_run,
        view_name=view_name,
        request_path=request_path(http),
    )
