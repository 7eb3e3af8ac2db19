"""Request in, decision out: proceed, replay, 409, 422 or 400. No DRF.

The order of the decisions is documented in docs/protocol.md.

:func:`begin` reads the key, resolves the scope, fingerprints the request and claims
the key. What happens once a request owns a key (the view in ``transaction.atomic()``,
then completion, release or fencing) is ``execution.execute``. The decorator and the
DRF mixin are thin glue over these two functions.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import DatabaseError, InterfaceError
from django.http import HttpRequest, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase

from django_idempotency import extractors, fingerprint, problems, signals, store, transactions
from django_idempotency.conf import conf
from django_idempotency.context import IdempotencyContext, running
from django_idempotency.keys import HEADER, InvalidKey, parse_key
from django_idempotency.logging import key_hash
from django_idempotency.options import Options
from django_idempotency.responses import REPLAYED_HEADER, HeaderPolicy, build
from django_idempotency.store import operators, presence

logger = logging.getLogger("django_idempotency")

#: Never recorded, key or not (RFC 9110 §9.2.1).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_COLUMN = 255


@dataclass(frozen=True)
class Bypass:
    """Run the view as if the app were not there (safe method, or optional key absent)."""


@dataclass(frozen=True)
class Respond:
    """Answer with ``response`` without running the view (replay or problem)."""

    response: HttpResponseBase


@dataclass(frozen=True)
class Proceed:
    """The request owns the key: run the view through ``execution.execute``."""

    claim: store.Claim
    options: Options
    view_name: str = ""


@dataclass(frozen=True)
class CannotRun:
    """The view would have to run, but the caller said it may not (nothing claimed)."""


@dataclass(frozen=True)
class Nested:
    """The request's scope is the one the running idempotent view claimed (docs/faq.md).

    The view runs as part of that execution: no claim of its own, its writes in the
    running view's transaction (or open phase), ``request.idempotency`` the running
    view's ``context``, its response handed back to the running view, which settles
    the claim.
    """

    context: IdempotencyContext


BYPASS = Bypass()
CANNOT_RUN = CannotRun()


def _fit(value: str) -> str:
    """``value`` if it fits the 255-character columns, else a stable shortened form."""
    if len(value) <= _COLUMN:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{value[: _COLUMN - 66]}~{digest}"


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
        return _fit(options.endpoint)
    match = getattr(request, "resolver_match", None)
    route = getattr(match, "route", None)
    route = normalise_route(route) if route else view_name
    return _fit(f"{(request.method or '').upper()} /{route}")


def _problem(kind: problems.ProblemType, detail: str, **kw: Any) -> Respond:
    return Respond(problems.problem_response(kind, detail, **kw))


def _fingerprint(request: Any, http: HttpRequest, options: Options) -> str | Respond:
    parsed = None
    if http is not request and getattr(http, "_read_started", False) and not hasattr(http, "_body"):
        parsed = request.data  # DRF consumed the stream before us
    try:
        return fingerprint.compute(
            http,
            exclude=options.get_fingerprint_exclude(),
            headers=options.get_fingerprint_headers(),
            parsed_body=parsed,
            form_exclude=conf.fingerprint_form_tokens,
        )
    except RequestDataTooBig:
        return _problem(
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
        return _problem(
            problems.UNREADABLE_BODY,
            f"The request body could not be read ({type(exc).__name__}); nothing was "
            "done. Check its Content-Type and encoding, then retry with the same key.",
        )
    except RecursionError:  # json.loads / json.dumps on absurdly deep nesting
        return _problem(
            problems.UNREADABLE_BODY,
            "The JSON request body is nested too deeply to be read; nothing was done. "
            "Flatten it, then retry.",
        )


def _key_name(options: Options) -> str:
    """What the client calls the key, for messages: the header, or the view's own key."""
    return HEADER if options.key is None else "idempotency key (event id)"


def _no_principal(request: Any, options: Options) -> Respond:
    """401 with the view's ``WWW-Authenticate`` challenge (DRF), else 403, as DRF does."""
    challenge = None
    for authenticator in getattr(request, "authenticators", None) or ():
        challenge = authenticator.authenticate_header(request)
        if challenge:
            break
    detail = (
        f"Requests with an {_key_name(options)} must be authenticated, so that one "
        "client's key never collides with another's. Authenticate and retry."
    )
    if not challenge:
        return _problem(problems.NO_PRINCIPAL_FORBIDDEN, detail)
    respond = _problem(problems.NO_PRINCIPAL, detail)
    respond.response["WWW-Authenticate"] = challenge
    return respond


def _key(request: Any, http: HttpRequest, options: Options) -> str | Respond | Bypass:
    """The request's idempotency key: the header, or the view's ``key=`` extractor."""
    extractor = options.get_key_extractor()
    max_length = min(conf.max_key_length, _COLUMN)
    try:
        if extractor is None:
            key = parse_key(http.headers.get(HEADER), max_length=max_length)
        else:
            key = extractors.extract(extractor, request, max_length=max_length)
    except InvalidKey as exc:
        kind = problems.INVALID_KEY if extractor is None else problems.INVALID_EXTRACTED_KEY
        return _problem(kind, str(exc))
    if key is not None:
        return key
    if not options.get_required():
        return BYPASS
    if extractor is not None:
        return _problem(
            problems.MISSING_EXTRACTED_KEY,
            f"This endpoint takes its idempotency key from {extractors.source(extractor)}, "
            "which the request does not carry.",
        )
    return _problem(
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
    principal = options.get_principal()(request)
    if not principal:
        return _no_principal(request, options)
    scope = store.Scope(_fit(str(principal)), endpoint_for(http, options, view_name), key)
    using = options.get_using(request)
    outer = running(scope, using, request)
    if outer is not None:  # called by the running view with its scope: no second claim
        return Nested(outer)
    fp = _fingerprint(request, http, options)
    if isinstance(fp, Respond):
        return fp
    if may_run and transactions.outer_block(using):  # the claim could not commit on its own
        transactions.warn_outer(scope.endpoint, view_name, using)
    return _claim(scope, fp, options, using, may_run=may_run, view_name=view_name)


def _claim(
    scope: store.Scope,
    fp: str,
    options: Options,
    using: str,
    *,
    may_run: bool,
    view_name: str = "",
) -> Respond | Proceed | CannotRun:
    signal_kwargs = {
        "principal": scope.principal,
        "endpoint": scope.endpoint,
        "key_hash": key_hash(scope.key),
    }
    deadline = time.monotonic() + options.get_wait()
    delay = 0.05
    while True:
        try:
            if may_run:
                result: store.Claim | store.Existing | None = store.claim(
                    scope,
                    fp,
                    lease=options.get_lease(),
                    retention=options.get_retention(),
                    using=using,
                )
            else:
                result = operators.peek(scope, fp, using=using)
        except (DatabaseError, InterfaceError) as exc:
            signals.store_failed.send(scope.endpoint, error=exc, **signal_kwargs)
            return _problem(
                problems.STORE_UNAVAILABLE,
                "The idempotency store failed or was busy (its database unreachable, "
                "or locked by another request), so the request was not run. Retry "
                "later with the same key.",
                retry_after=conf.retry_after,
            )
        if result is None:
            return CANNOT_RUN
        if isinstance(result, store.Claim):
            try:
                signals.claimed.send(
                    scope.endpoint,
                    taken_over=result.taken_over,
                    presence=result.by_presence,
                    cause=result.takeover_cause,
                    **signal_kwargs,
                )
            except BaseException:  # a receiver failed: this request will not run the view
                store.abandon(result)  # nothing ran: the key is free for a retry at once
                raise
            return Proceed(result, options, view_name)
        if result.fingerprint != fp:
            signals.mismatched.send(scope.endpoint, **signal_kwargs)
            return _problem(
                problems.KEY_REUSED,
                f"This {_key_name(options)} was already used for a different request "
                "(method, path, query or body differ). Use a new key for a new operation.",
            )
        if result.response is not None:
            signals.replayed.send(scope.endpoint, status=result.response.status, **signal_kwargs)
            policy = HeaderPolicy.current(options.get_replay_headers())
            if not result.response.replayable:
                return Respond(_too_large_to_replay(result.response, policy))
            return Respond(build(result.response, replayed=True, policy=policy))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            signals.in_flight.send(scope.endpoint, **signal_kwargs)
            return _in_flight()
        if result.owner_pid is not None and presence.can_wait(using):
            # Woken by the owner's completion (its presence lock), not by polling.
            started = time.monotonic()
            try:
                woken = presence.wait_for_owner(
                    using, scope, min(remaining, max(result.lease_remaining, 0.0) + 0.05)
                )
            except presence.WaitersFull:
                signals.in_flight.send(scope.endpoint, waiters_full=True, **signal_kwargs)
                return _in_flight()
            except (DatabaseError, InterfaceError):
                woken = False  # e.g. a statement_timeout: poll instead
                time.sleep(min(delay, remaining))
            if woken:
                signals.woken.send(
                    scope.endpoint, waited=time.monotonic() - started, **signal_kwargs
                )
            continue
        time.sleep(min(delay, remaining))  # bounded in-flight wait (opt-in per view)
        delay = min(delay * 2, 0.5)


def _in_flight() -> Respond:
    return _problem(
        problems.IN_FLIGHT,
        "A request with this key is still being processed. Retry after the "
        "number of seconds in Retry-After, with the same key, to get its result.",
        retry_after=conf.retry_after,
    )


#: Headers of the stored response that describe its body, not sent with the 410's.
_BODY_HEADERS = ("content-", "digest", "repr-digest")


def _too_large_to_replay(stored: store.StoredResponse, policy: HeaderPolicy) -> HttpResponseBase:
    """410 for a completed request whose body was too large to keep (MAX_RESPONSE_BYTES).

    The request ran and will not run again; the client gets its status and the
    replayable headers that point at the result (Location, ETag, ...), but none that
    describe the stored body (``Content-*``, digests): the 410 has its own.
    """
    response = problems.problem_response(
        problems.RESPONSE_TOO_LARGE,
        f"The request with this {HEADER} already completed with status {stored.status}, "
        "but its response was too large to keep for replay. It will not run again; "
        "fetch its result instead (see the Location header, if any).",
        extensions={"original_status": stored.status},
    )
    for name, value in policy.filter(stored.headers):
        if not name.lower().startswith(_BODY_HEADERS):
            response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response
