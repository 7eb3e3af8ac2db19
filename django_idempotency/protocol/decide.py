"""The claim, and what to answer when the key is taken (docs/protocol.md).

:func:`decide` claims the scope in the store and turns the outcome into a decision:
:class:`~django_idempotency.protocol.decisions.Proceed` when the request owns the key;
a replay of the stored response; 422 when the key was used for another request; 409
(with ``Retry-After``) while the first request is in flight, after waiting up to the
view's ``wait``, woken by the owner's completion where owner presence allows; 503 when
the store fails (fail closed: the view never runs without a claim); 500 when the
request runs in a tenant schema without the store's tables (docs/tenants.md).
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, InterfaceError
from django.http.response import HttpResponseBase

from django_idempotency import signals, store
from django_idempotency.conf import conf
from django_idempotency.logs import scope_fields
from django_idempotency.protocol import problems
from django_idempotency.protocol.decisions import CANNOT_RUN, CannotRun, Proceed, Respond, problem
from django_idempotency.protocol.digests import Fingerprint, differing_parts
from django_idempotency.protocol.keys import HEADER
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.release import announce
from django_idempotency.protocol.responses import REPLAYED_HEADER, HeaderPolicy, build
from django_idempotency.store import operators, presence, tenants

logger = logging.getLogger("django_idempotency")


def key_name(options: Options) -> str:
    """What the client calls the key, for messages: the header, or the view's own key."""
    return HEADER if options.key is None else "idempotency key (event id)"


def decide(
    scope: store.Scope,
    fp: Fingerprint,
    options: Options,
    using: str,
    *,
    may_run: bool,
    view_name: str = "",
    request_path: str = "",
) -> Respond | Proceed | CannotRun:
    """Claim ``scope`` for a request with fingerprint ``fp``, or answer from the record.

    Args:
        scope: the record's identity (principal, endpoint, key).
        fp: the request's fingerprint (``fingerprint.take``); a record stored under
            another configuration of the fingerprint matches a byte-identical request
            (``store.fingerprints.same_request``).
        options: the view's options (lease, retention, wait, replay headers).
        using: the alias of the record's database.
        may_run: ``False`` when the view cannot run for this request (DRF found no
            renderer for its ``Accept``): the record is only looked up, never claimed.
        view_name: dotted name of the view, for the :class:`Proceed`.
        request_path: the concrete path, kept with a new record (``begin.request_path``).

    Returns:
        :class:`Proceed` with the claim; :class:`Respond` with a replay (or the 410 of
        a response too large to keep), the 422 ``key-reused``, the 409
        ``request-in-flight`` (after waiting up to the view's ``wait``) or the 503
        ``store-unavailable``; :class:`CannotRun` when ``may_run`` is ``False`` and
        the view would have to run. Never raises for a store failure.

    Raises:
        Whatever a ``claimed`` signal receiver raised, after the claim was given up.
    """
    signal_kwargs = scope_fields(scope)
    deadline = time.monotonic() + options.get_wait()
    delay = 0.05
    while True:
        try:
            if may_run:
                result: store.Claim | store.Existing | None = store.claim(
                    scope,
                    fp.value,
                    lease=options.get_lease(),
                    retention=options.get_retention(),
                    using=using,
                    request_path=request_path,
                )
            else:
                result = operators.peek(scope, fp.value, using=using)
        except (DatabaseError, InterfaceError) as exc:
            schema = tenants.schema_without_tables(using, exc)
            if schema is not None:  # not an outage: no store_failed (a 503's signal)
                return _not_set_up(schema, using, scope)
            signals.store_failed.send(scope.endpoint, error=exc, **signal_kwargs)
            return problem(
                problems.STORE_UNAVAILABLE,
                "The idempotency store failed or was busy (its database unreachable, "
                "or locked by another request), so the request was not run. Retry "
                "later with the same key.",
                retry_after=conf.retry_after,
            )
        if result is None:
            return CANNOT_RUN
        if isinstance(result, store.Claim):
            announce(result)
            return Proceed(result, options, view_name)
        verdict = store.judge(result, fp.value)
        if verdict is store.Verdict.MISMATCH:
            signals.mismatched.send(scope.endpoint, **signal_kwargs)
            return _reused(options, differing_parts(result.fingerprint, fp.value))
        if verdict is store.Verdict.REPLAY:
            stored = result.response
            assert stored is not None  # a completed record holds its response
            signals.replayed.send(
                scope.endpoint,
                status=stored.status,
                age=result.age,
                window=result.window,
                near_window_end=signals.replay_near_window_end(result.age, result.window),
                **signal_kwargs,
            )
            policy = HeaderPolicy.current(options.get_replay_headers())
            if not stored.replayable:
                return Respond(_too_large_to_replay(stored, policy))
            return Respond(build(stored, replayed=True, policy=policy))
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


_WORDS = {
    "method": "method",
    "path": "path",
    "query": "query string",
    "headers": "fingerprinted headers",
    "body": "body",
}
#: What a server can leave out of the fingerprint, by part (docs/configuration.md).
_REMEDIES = {
    "headers": "the headers that count are FINGERPRINT_HEADERS and the view's fingerprint_headers=",
    "body": "body fields that change between attempts can be left out with "
    "FINGERPRINT_EXCLUDE or the view's fingerprint_exclude=, per-render form fields "
    "with FINGERPRINT_FORM_TOKENS",
}


def _not_set_up(schema: str, using: str, scope: store.Scope) -> Respond:
    """The 500 ``store-not-set-up``: the request's schema has no record table.

    Logged at ERROR with the fix; the client is told not to retry (nothing it can do
    changes it). The response names no schema: that is the server's business.
    """
    if schema == tenants.public_schema():
        fix = (
            "serve the public site from a PUBLIC_SCHEMA_URLCONF without idempotent views, "
            "or add 'django_idempotency' to SHARED_APPS as well and run "
            "'manage.py migrate_schemas --shared' (check django_idempotency.E012)"
        )
    else:
        fix = "run 'manage.py migrate_schemas' for this tenant"
    logger.error(
        "idempotent request refused: schema %r of database %r, where the request runs, "
        "has no django_idempotency tables; %s (docs/tenants.md)",
        schema,
        using,
        fix,
        extra={"principal": scope.principal, "endpoint": scope.endpoint},
    )
    return problem(
        problems.STORE_NOT_SET_UP,
        "This site is not set up for idempotent requests: the server has no idempotency "
        "store for it, so the request was not run. Retrying will not help; the "
        "server's operators have been told.",
    )


def _reused(options: Options, parts: tuple[str, ...]) -> Respond:
    """The 422 ``key-reused``, naming the differing ``parts`` (none: no tag tells).

    Only part names: never the body, nor a value of the request or of the record.
    """
    kind = problems.KEY_REUSED if options.key is None else problems.KEY_REUSED_EXTRACTED
    if not parts:
        return problem(
            kind,
            f"This {key_name(options)} was already used for a different request "
            "(method, path, query, headers or body differ). Use a new key for a new "
            "operation.",
        )
    words = [_WORDS[part] for part in parts]
    names = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
    verb = "differ" if len(parts) > 1 or parts == ("headers",) else "differs"
    remedies = [_REMEDIES[part] for part in parts if part in _REMEDIES]
    if any(part not in _REMEDIES for part in parts):
        remedies.append("the method, path and query string always count")
    return problem(
        kind,
        f"This {key_name(options)} was already used for a different request: its "
        f"{names} {verb} from the first request's. Use a new key for a new operation; "
        f"a retry must send the request as it was first sent ({'; '.join(remedies)}).",
        extensions={"differs": list(parts)},
    )


def _in_flight() -> Respond:
    return problem(
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
