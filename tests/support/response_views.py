"""Views answering binary, latin-1, empty, sized and described bodies, writing in
``on_commit`` callbacks and nested blocks, and failing once while duplicates wait
(tests/protocol/test_replay_fidelity.py, tests/transactions/test_on_commit.py,
tests/transactions/test_nested_blocks.py, tests/protocol/test_released_waiters.py;
wired with ``pytest.mark.urls``)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.urls import path
from rest_framework.decorators import api_view
from rest_framework.response import Response

from django_idempotency import idempotent
from tests.support.testapp.models import Widget


def _on_commit_widget(name: str) -> None:
    transaction.on_commit(lambda: Widget.objects.create(name=name))


@idempotent
@api_view(["POST"])
def binary(request: Any) -> Any:
    Widget.objects.create(name="binary")
    return HttpResponse(
        bytes(range(256)) + b"\x00\r\n", content_type="application/octet-stream", status=201
    )


@idempotent
@api_view(["POST"])
def latin1(request: Any) -> Any:
    Widget.objects.create(name="latin1")
    return HttpResponse("caf\u00e9", content_type="text/plain; charset=latin-1", status=201)


@idempotent
@api_view(["POST"])
def no_content(request: Any) -> Any:
    Widget.objects.create(name="no-content")
    return HttpResponse(status=204)


@idempotent
@api_view(["POST"])
def sized(request: Any) -> Any:
    Widget.objects.create(name="sized")
    response = HttpResponse(b"x" * int(request.data["n"]), content_type="text/plain", status=201)
    response["Location"] = "/things/1"
    return response


@idempotent
@api_view(["POST"])
def described(request: Any) -> Any:
    Widget.objects.create(name="described")
    response = Response({"ok": True}, status=201)
    response["Vary"] = "Cookie"
    response["Cache-Control"] = "no-store"
    response["Content-Language"] = "fr"
    response["Link"] = '</things/1>; rel="self"'
    return response


@idempotent
@api_view(["POST"])
def on_commit_view(request: Any) -> Any:
    Widget.objects.create(name="body")
    _on_commit_widget("on-commit")
    return Response({"ok": True}, status=int(request.data.get("status", 201)))


@idempotent
@api_view(["POST"])
def caught_integrity(request: Any) -> Any:
    """Writes, then a duplicate Token inside a nested atomic() whose IntegrityError it
    catches: the savepoint rolls back, the outer writes stand, the view answers 201."""
    from rest_framework.authtoken.models import Token

    Widget.objects.create(name="kept")
    try:
        with transaction.atomic():
            Widget.objects.create(name="rolled-back-inner")
            Token.objects.create(user=request.user)  # one per user: IntegrityError
    except IntegrityError:
        pass
    _on_commit_widget("after-caught")
    return Response({"ok": True}, status=201)


#: Test-controlled state of ``flaky_wait``: ``gate`` holds the first run mid-flight.
FLAKY: dict[str, Any] = {}


@idempotent(wait=20)
@api_view(["POST"])
def flaky_wait(request: Any) -> Any:
    """First run answers 503 (released) after a gate; every later run 201."""
    with FLAKY["lock"]:
        FLAKY["runs"] += 1
        run = FLAKY["runs"]
    Widget.objects.create(name=f"flaky-{run}")
    if run == 1:
        FLAKY["entered"].set()
        if not FLAKY["open"].wait(30):
            raise RuntimeError("gate never opened")
        return Response({"retry": True}, status=503)
    return Response({"run": run}, status=201)


urlpatterns = [
    path("responses/flaky-wait", flaky_wait),
    path("responses/binary", binary),
    path("responses/latin1", latin1),
    path("responses/no-content", no_content),
    path("responses/sized", sized),
    path("responses/described", described),
    path("responses/on-commit", on_commit_view),
    path("responses/caught-integrity", caught_integrity),
]
