"""What the decorator and the DRF mixin share: run one view call through the protocol.

Also the ``ATOMIC_REQUESTS`` handling (docs/usage.md): idempotent views are marked
non-atomic so the claim commits on its own, and every path that Django would have
wrapped in ``atomic()`` is wrapped here instead.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from django.db import connections, transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.protocol import execute
from django_idempotency.protocol.begin import begin
from django_idempotency.protocol.context import UnprotectedContext
from django_idempotency.protocol.decisions import Bypass, CannotRun, Nested, Proceed, Respond
from django_idempotency.protocol.options import Options
from django_idempotency.protocol.responses import REPLAYED_HEADER
from django_idempotency.store import presence

#: Attribute of a DRF request holding the ``NotAcceptable`` that replay-aware content
#: negotiation deferred (``drf.ReplayNegotiationMixin``): raised if the view must run.
NOT_ACCEPTABLE = "_idempotency_not_acceptable"
#: Attribute of a DRF renderer: a function given each replay answered to a request that
#: negotiated that renderer, returning the response to send (``contrib.browsable``
#: marks a page it rendered as a replay, for the person reading it).
REPLAY_MARK_ATTRIBUTE = "idempotency_mark_replay"


class AllDatabases(set[str]):
    """A ``_non_atomic_requests`` set that contains every database alias.

    Django's handler skips ``ATOMIC_REQUESTS`` for aliases in this set; the decorator
    cannot know the aliases at import time, so it claims them all.
    """

    def __contains__(self, alias: object) -> bool:
        return True


def mark_non_atomic(view: Any) -> Any:
    """Exempt ``view`` from ``ATOMIC_REQUESTS`` on every database; returns ``view``."""
    view._non_atomic_requests = AllDatabases()
    return view


def atomic_requests_blocks(exclude: str | None = None) -> ExitStack:
    """``atomic()`` for each database with ``ATOMIC_REQUESTS`` (but ``exclude``).

    These are the blocks Django's handler would have opened had the view not been
    marked non-atomic.
    """
    stack = ExitStack()
    for connection in connections.all():
        if connection.settings_dict.get("ATOMIC_REQUESTS") and connection.alias != exclude:
            stack.enter_context(transaction.atomic(using=connection.alias))
    return stack


def find_request(args: tuple[Any, ...]) -> Any:
    """The request among a view's first positional arguments (function or method).

    Raises:
        TypeError: none of the first two arguments is a request.
    """
    for arg in args[:2]:
        if isinstance(arg, HttpRequest) or hasattr(arg, "_request"):
            return arg
    raise TypeError(
        "@idempotent could not find the request: decorate a view function "
        "(request, ...) or a view method (self, request, ...)."
    )


def make_finalizer(
    request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[HttpResponseBase], HttpResponseBase]:
    """A function that turns a view's response into final bytes before it is stored.

    For DRF it runs the view's ``finalize_response`` (content negotiation, renderer,
    default headers) exactly as DRF will; for template responses it renders them.
    """
    view = (getattr(request, "parser_context", None) or {}).get("view")

    def finalize(response: HttpResponseBase) -> HttpResponseBase:
        if view is not None and hasattr(view, "finalize_response"):
            response = view.finalize_response(request, response, *args, **kwargs)
        render = getattr(response, "render", None)
        if callable(render) and not getattr(response, "is_rendered", True):
            response = render() or response
        return response

    return finalize


def run(
    request: Any,
    options: Options,
    view_name: str,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
) -> HttpResponseBase:
    """Run ``call`` (the view) under the idempotency protocol and return the response.

    A view called by the running idempotent view with the same scope (principal,
    endpoint, key) runs as part of that view's execution: ``call`` is run as is, and
    its response returned unrendered (docs/faq.md). The call is an entry point
    (``presence.entry_point``): presence locks its claims leave held are released when
    it ends.

    Raises:
        rest_framework.exceptions.NotAcceptable: no renderer fits the request's
            ``Accept`` and the view would have to run (a replay, 409 or 422 is
            answered whatever the ``Accept``); nothing was claimed.
    """
    with presence.entry_point("request"):
        return _run(request, options, view_name, call, finalize)


def _run(
    request: Any,
    options: Options,
    view_name: str,
    call: Callable[[], HttpResponseBase],
    finalize: Callable[[HttpResponseBase], HttpResponseBase],
) -> HttpResponseBase:
    not_acceptable = getattr(request, NOT_ACCEPTABLE, None)
    decision = begin(request, options, view_name=view_name, may_run=not_acceptable is None)
    if isinstance(decision, Respond):
        return _marked(request, decision.response)
    if not_acceptable is not None and isinstance(decision, (CannotRun, Bypass, Nested)):
        raise not_acceptable  # the view would have to run: DRF's 406
    if isinstance(decision, Nested):
        # Called by the running view with the same scope: part of its execution, in its
        # transaction; that view renders, stores or releases what this one returns.
        execute.attach(request, decision.context)
        return call()
    if isinstance(decision, Bypass):
        # A phased view without a key (key optional) runs its phases unprotected.
        unprotected = None
        if options.phases:
            unprotected = UnprotectedContext(options.phases, options.get_using(request))
        execute.attach(request, unprotected)
        with atomic_requests_blocks():
            return call()
    assert isinstance(decision, Proceed)  # CannotRun only when may_run is False
    # Other databases with ATOMIC_REQUESTS keep their per-request transaction; the
    # record's database gets the view's own block, opened after the claim committed.
    try:
        with atomic_requests_blocks(exclude=decision.claim.using):
            return execute.execute(decision, request, call, finalize)
    finally:  # also when a block could not be opened and the view never ran
        presence.ensure_released(decision.claim)


def _marked(request: Any, response: HttpResponseBase) -> HttpResponseBase:
    """``response``, a replay marked by the negotiated renderer if it marks replays."""
    renderer = getattr(request, "accepted_renderer", None)
    mark = getattr(renderer, REPLAY_MARK_ATTRIBUTE, None)
    if mark is None or response.get(REPLAYED_HEADER) != "true":
        return response
    marked: HttpResponseBase = mark(response)
    return marked
