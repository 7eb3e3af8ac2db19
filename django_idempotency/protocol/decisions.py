"""What the protocol decides for a request before its view runs (docs/protocol.md).

:func:`~django_idempotency.protocol.begin.begin` returns one of these:
:class:`Bypass` (run the view as if the app were not there), :class:`Respond` (answer
without running it: a replay or a problem), :class:`Proceed` (the request owns the key:
run it), :class:`Nested` (it runs inside the running view's claim) or
:class:`CannotRun` (it would have to run, but may not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http.response import HttpResponseBase

from django_idempotency import store
from django_idempotency.protocol import problems
from django_idempotency.protocol.context import IdempotencyContext
from django_idempotency.protocol.options import Options


@dataclass(frozen=True)
class Bypass:
    """Run the view as if the app were not there (safe method, or optional key absent)."""


@dataclass(frozen=True)
class Respond:
    """Answer with ``response`` without running the view (replay or problem)."""

    response: HttpResponseBase


@dataclass(frozen=True)
class Proceed:
    """The request owns the key: run the view through ``execute.execute``."""

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


def problem(kind: problems.ProblemType, detail: str, **kw: Any) -> Respond:
    """:class:`Respond` with the problem+json response of ``kind`` (``problems``)."""
    return Respond(problems.problem_response(kind, detail, **kw))
