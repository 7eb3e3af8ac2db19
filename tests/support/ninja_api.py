"""A Django Ninja API protected by ``django_idempotency.contrib.ninja``, for the tests.

Authentication is the API's (``auth=``): a bearer DRF token, ``request.auth`` the
token's user. ``X-Gate: <name>`` holds a request in the operation on the gate of that
name (``tests.support.testapp.gates``); in a server process, ``X-Gate: fifo`` holds it on the
two FIFOs of ``NINJA_GATE_DIR`` (``entered`` written when the operation is reached,
``opened`` read before it goes on), so a test in another process can hold it too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.urls import path
from ninja import NinjaAPI, Router, Schema
from ninja.responses import Status
from ninja.security import APIKeyHeader, HttpBearer
from rest_framework.authtoken.models import Token

from django_idempotency import outbox
from django_idempotency.contrib.ninja import credential_principal, idempotent
from tests.support.testapp.gates import GATES
from tests.support.testapp.models import Widget


class TokenBearer(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = Token.objects.select_related("user").filter(key=token).first()
        return found.user if found is not None else None


class TokenRowBearer(HttpBearer):
    """``request.auth`` is the token row (DRF's ``Token``), whose ``user`` is the client."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return Token.objects.select_related("user").filter(key=token).first()


class BareTokenBearer(HttpBearer):
    """``request.auth`` is the token string itself: it names no user."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return token if Token.objects.filter(key=token).exists() else None


class ApiKey(APIKeyHeader):
    param_name = "X-API-Key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return key if key and key.startswith("key-") else None


class WidgetIn(Schema):
    name: str
    size: int = 0


class WidgetOut(Schema):
    id: int
    name: str
    size: int


def hold(request: HttpRequest) -> None:
    """Wait on the gate ``X-Gate`` names, if any."""
    name = request.headers.get("X-Gate")
    if not name:
        return
    if name == "fifo":
        folder = Path(os.environ["NINJA_GATE_DIR"])
        with (folder / "entered").open("w") as entered:
            entered.write("entered")
        with (folder / "opened").open() as opened:
            opened.read()
        return
    GATES[name].pass_through()


router = Router()


@router.post("/widgets", response={201: WidgetOut})
@idempotent(wait=0)
def create_widget(request: HttpRequest, payload: WidgetIn) -> Any:
    hold(request)
    widget = Widget.objects.create(name=payload.name, size=payload.size)
    return Status(201, widget)


@router.get("/widgets", response=list[WidgetOut])
def list_widgets(request: HttpRequest) -> Any:
    return list(Widget.objects.order_by("pk"))


@router.post("/unprotected", response={201: WidgetOut})
def unprotected(request: HttpRequest, payload: WidgetIn) -> Any:
    return Status(201, Widget.objects.create(name=payload.name, size=payload.size))


@router.post("/unprotected-fails")
def unprotected_fails(request: HttpRequest, payload: WidgetIn) -> Any:
    """Writes, then raises: under ``ATOMIC_REQUESTS`` the write is rolled back."""
    Widget.objects.create(name=payload.name)
    raise RuntimeError("the unprotected operation failed after its write")


@router.post("/async-widgets", response={201: WidgetOut})
@idempotent(wait=0)
async def create_widget_async(request: HttpRequest, payload: WidgetIn) -> Any:
    await sync_to_async(hold)(request)
    widget = await Widget.objects.acreate(name=payload.name, size=payload.size)
    return Status(201, widget)


@router.put("/widgets/{widget_id}/resize")
@idempotent
def resize(request: HttpRequest, widget_id: int, payload: WidgetIn) -> dict[str, Any]:
    """A dict through the API's renderer; the endpoint is the route, not the resource."""
    updated = Widget.objects.filter(pk=widget_id).update(size=payload.size)
    return {"id": widget_id, "updated": updated, "endpoint": request.idempotency.endpoint}


@router.post("/keys", auth=ApiKey(), response={201: dict[str, Any]})
@idempotent(principal=credential_principal)
def with_api_key(request: HttpRequest, payload: WidgetIn) -> Any:
    """``request.auth`` is the API key string: keys are scoped by it (its digest)."""
    widget = Widget.objects.create(name=payload.name, size=payload.size)
    return Status(201, {"id": widget.pk})


@router.post("/token-rows", auth=TokenRowBearer(), response={201: dict[str, Any]})
@idempotent
def with_token_row(request: HttpRequest, payload: WidgetIn) -> Any:
    """``request.auth`` is the token row: keys are scoped by its user."""
    return Status(201, {"id": Widget.objects.create(name=payload.name).pk})


@router.post("/bare-token", auth=BareTokenBearer(), response={201: dict[str, Any]})
@idempotent
def with_bare_token(request: HttpRequest, payload: WidgetIn) -> Any:
    """``request.auth`` is the token string: no user, so keyed requests are refused."""
    return Status(201, {"id": Widget.objects.create(name=payload.name).pk})


def team(request: HttpRequest) -> str | None:
    """The team of ``X-Team``: every member shares the team's keys."""
    name = request.headers.get("X-Team")
    return f"team:{name}" if name else None


@router.post("/team-widgets", response={201: dict[str, Any]})
@idempotent(principal=team)
def team_widget(request: HttpRequest, payload: WidgetIn) -> Any:
    """Its own ``principal=``: keys are the team's, not the user's."""
    return Status(201, {"id": Widget.objects.create(name=payload.name).pk})


@router.post("/labelled", response={201: dict[str, Any]})
@idempotent
def labelled(request: HttpRequest, response: HttpResponse, payload: WidgetIn) -> Any:
    """Sets a header and a cookie on Ninja's temporal ``response``."""
    widget = Widget.objects.create(name=payload.name)
    response["X-Widget-Id"] = str(widget.pk)
    response.set_cookie("last_widget", str(widget.pk))
    return Status(201, {"id": widget.pk})


@router.post("/anonymous", auth=None, response={201: dict[str, Any]})
@idempotent
def anonymous(request: HttpRequest, payload: WidgetIn) -> Any:
    return Status(201, {"id": Widget.objects.create(name=payload.name).pk})


@router.post("/phased", response={201: dict[str, Any]})
@idempotent(phases=["created", "resized"])
def phased(request: HttpRequest, payload: WidgetIn) -> Any:
    """Two phases; ``X-Fail: between`` stops after the first one."""
    idem = request.idempotency
    name = f"{payload.name}-{idem.derive_key('widget')[:8]}"
    if idem.pending("created"):
        with idem.phase("created"):
            Widget.objects.create(name=name)
    if request.headers.get("X-Fail") == "between":
        raise RuntimeError("stopped between the phases")
    if idem.pending("resized"):
        with idem.phase("resized"):
            Widget.objects.filter(name=name).update(size=payload.size)
    return Status(201, {"id": Widget.objects.get(name=name).pk})


@router.post("/notify", response={201: dict[str, Any]})
@idempotent
def notify(request: HttpRequest, payload: WidgetIn) -> Any:
    widget = Widget.objects.create(name=payload.name)
    message = outbox.enqueue("ninja.widget", {"id": widget.pk})
    return Status(201, {"id": widget.pk, "dedup_key": message.dedup_key})


@router.post("/elsewhere", response={201: dict[str, Any]})
@idempotent(using="shard")
def elsewhere(request: HttpRequest, payload: WidgetIn) -> Any:
    """Its records are on ``shard``; the write to ``default`` is refused."""
    Widget.objects.create(name=payload.name)
    return Status(201, {})


api = NinjaAPI(urls_namespace="ninja-tests", auth=TokenBearer())
api.add_router("/", router)

urlpatterns = [path("ninja/", api.urls)]
