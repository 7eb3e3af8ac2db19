from __future__ import annotations

import json
import threading

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin, idempotent, outbox

from .gates import GATES, HOOKS
from .models import Widget


class WidgetSerializer(serializers.ModelSerializer):
    class Meta:
        model = Widget
        fields = ["id", "name", "size"]


def _gate(request) -> None:
    name = request.headers.get("X-Gate")  # a header: not part of the fingerprint
    if name:
        GATES[name].pass_through()
    hook = HOOKS.get("during_view")
    if callable(hook):
        hook(request)


@api_view(["POST"])
@idempotent
def create_widget(request):
    """DRF function view: creates a Widget, 201 with Location."""
    serializer = WidgetSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    widget = serializer.save()
    _gate(request)
    response = Response(serializer.data, status=status.HTTP_201_CREATED)
    response["Location"] = f"/widgets/{widget.pk}"
    response["ETag"] = f'"w{widget.pk}"'
    response["X-Request-ID"] = "req-1"
    response["X-Widget-Version"] = "v7"
    response.set_cookie("session-ish", "secret")
    return response


@api_view(["POST"])
@idempotent
def label(request, name: str):
    """DRF function view on a route with a free-text segment: 201 with the name."""
    return Response({"label": name}, status=status.HTTP_201_CREATED)


#: A body large enough to be bound on the server (store.records.postgresql.BOUND_BODY_BYTES),
#: every byte value in it.
LARGE_BODY = bytes(range(256)) * 1024


@csrf_exempt
@idempotent
def large_body(request: HttpRequest) -> HttpResponse:
    """Plain Django view: a write inside a savepoint, then a 256 KiB binary body."""
    from django.db import transaction

    with transaction.atomic():
        widget = Widget.objects.create(name="large")
    _gate(request)
    response = HttpResponse(LARGE_BODY, content_type="application/octet-stream", status=201)
    response["Location"] = f"/widgets/{widget.pk}"
    return response


@api_view(["POST"])
@idempotent(required=False, retention=7 * 86400)
def optional_key(request):
    Widget.objects.create(name="optional")
    if HOOKS.get("after_optional"):
        raise RuntimeError("after the write")
    return Response({"count": Widget.objects.count()}, status=201)


@api_view(["POST"])
@idempotent
def outcome(request):
    """Creates a Widget, then answers with the status asked for in the body."""
    Widget.objects.create(name="outcome")
    code = int(request.data.get("status", 200))
    if request.data.get("raise"):
        raise RuntimeError("boom")
    return Response({"status": code}, status=code)


@api_view(["POST"])
@idempotent(wait=5)
def waiting(request):
    Widget.objects.create(name="waiting")
    _gate(request)
    return Response({"ok": True}, status=201)


@idempotent(lease=5)
@api_view(["POST"])
def slow(request):
    """Holds at a gate mid-flight; used for lease, takeover and fencing tests."""
    Widget.objects.create(name=request.data.get("name", "slow"))
    _gate(request)
    return Response({"name": request.data.get("name", "slow")}, status=201)


@api_view(["POST"])
@idempotent(lease=5)
def heartbeat(request):
    Widget.objects.create(name="heartbeat")
    ok = request.idempotency.extend_lease(60)
    _gate(request)
    return Response({"extended": ok}, status=201)


@api_view(["POST"])
@idempotent(lease=0.6, heartbeat=True)
def auto_heartbeat(request):
    """Runs at a gate well past its lease: the automatic heartbeat keeps the claim."""
    Widget.objects.create(name="auto-heartbeat")
    _gate(request)
    return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent(lease=30)
def release_503(request):
    """Writes, then answers 503: the claim is released."""
    Widget.objects.create(name="released")
    return Response({"retry": True}, status=503)


@api_view(["DELETE"])
@idempotent
def delete_widget(request, pk: int):
    deleted, _ = Widget.objects.filter(pk=pk).delete()
    if not deleted:
        return Response({"detail": "not found"}, status=404)
    return Response(status=204)


class RebootView(APIView):
    @idempotent
    def post(self, request, pk: int):
        widget = Widget.objects.get(pk=pk)
        widget.size += 1
        widget.save()
        return Response({"id": widget.pk, "reboots": widget.size})


class WidgetViewSet(IdempotentMixin, viewsets.ModelViewSet):
    queryset = Widget.objects.all()
    serializer_class = WidgetSerializer
    idempotent_actions = {"create": {"retention": 3600}, "resize": {}}

    @action(detail=True, methods=["post"])
    def resize(self, request, pk=None):
        widget = self.get_object()
        widget.size = int(request.data["size"])
        widget.save()
        return Response({"id": widget.pk, "size": widget.size})

    @action(detail=True, methods=["post"])
    def poke(self, request, pk=None):
        """Not listed in idempotent_actions: unprotected."""
        Widget.objects.create(name="poke")
        return Response({"poked": True})


@csrf_exempt
@idempotent
def plain_view(request: HttpRequest) -> HttpResponse:
    """A plain Django view (session auth)."""
    if request.method == "GET":
        return JsonResponse({"count": Widget.objects.count()})
    widget = Widget.objects.create(name=request.POST.get("name", "plain"))
    return JsonResponse({"id": widget.pk}, status=201)


@csrf_exempt
@idempotent
def streaming_view(request: HttpRequest) -> StreamingHttpResponse:
    Widget.objects.create(name="stream")
    return StreamingHttpResponse(iter([b"part1,", b"part2"]), content_type="text/plain")


@csrf_exempt
@idempotent
def streaming_dooms(request: HttpRequest) -> StreamingHttpResponse:
    """Streams a body whose generator catches a failing statement without a savepoint:
    on PostgreSQL that aborts the transaction while the app consumes the body."""
    from django.db import DatabaseError, connection

    Widget.objects.create(name="stream-doomed")

    def body():
        yield b"part1,"
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT no_such_column FROM testapp_widget")
        except DatabaseError:
            yield b"lookup failed"
            return
        yield b"part2"

    return StreamingHttpResponse(body(), status=200, content_type="text/plain")


@idempotent  # no csrf_exempt: on Django 4.2 it wraps async views in a sync function
async def async_view(request: HttpRequest) -> HttpResponse:
    widget = await Widget.objects.acreate(name="async")
    return JsonResponse({"id": widget.pk}, status=201)


# --- Phases and outbox (docs/phases.md) --------------------------------------------


class FakeHypervisor:
    """A downstream API that accepts a caller-supplied boot id and dedups on it.

    ``calls`` records every boot request; ``boots`` maps each distinct boot id to the
    VM it created, so "one boot per key" is ``len(boots)`` per key.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []
        self.boots: dict[str, str] = {}

    def boot(self, worker: str, *, boot_id: str) -> str:
        with self.lock:
            self.calls.append((worker, boot_id))
            return self.boots.setdefault(boot_id, f"vm-{len(self.boots) + 1}")

    def find(self, boot_id: str) -> str | None:
        with self.lock:
            return self.boots.get(boot_id)

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.boots.clear()


HYPERVISOR = FakeHypervisor()
PROVISION_PHASES = ["allocated", "leased", "booted"]
#: Widget.size of a provisioned worker after each phase.
PHASE_SIZES = {"allocated": 0, "leased": 1, "booted": 2}


def _crash(where: str) -> None:
    """Raise once at ``where`` if a test asked for it (``HOOKS["crash"] = where``)."""
    if HOOKS.get("crash") == where:
        del HOOKS["crash"]
        raise RuntimeError(f"crash {where}")


@idempotent(phases=PROVISION_PHASES, lease=5)
@api_view(["POST"])
def provision(request):
    """allocate -> lease -> boot, each phase its own transaction; the worker is a Widget
    named by a derived key, found again by that name when a retry resumes."""
    idem = request.idempotency
    name = idem.derive_key("worker")
    if idem.pending("allocated"):
        with idem.phase("allocated"):
            Widget.objects.create(name=name, size=PHASE_SIZES["allocated"])
            outbox.enqueue("worker.created", {"name": name})
            _crash("in:allocated")
    _crash("after:allocated")
    _gate(request)
    if idem.pending("leased"):
        with idem.phase("leased"):
            Widget.objects.filter(name=name).update(size=PHASE_SIZES["leased"])
    _crash("after:leased")
    status_after_leased = HOOKS.pop("status_after_leased", None)
    if status_after_leased:
        return Response({"detail": "hypervisor busy"}, status=status_after_leased)
    boot_id = idem.derive_key("boot")
    if idem.pending("booted"):
        with idem.phase("booted"):
            HYPERVISOR.boot(name, boot_id=boot_id)
            _crash("in:booted")  # after the downstream call, before the commit
            Widget.objects.filter(name=name).update(size=PHASE_SIZES["booted"])
    _crash("after:booted")
    worker = Widget.objects.get(name=name)
    return Response(
        {"id": worker.pk, "size": worker.size, "vm": HYPERVISOR.find(boot_id)}, status=201
    )


@idempotent
@api_view(["POST"])
def notify(request):
    """Creates a Widget and enqueues a message; raises or fails when the body asks."""
    widget = Widget.objects.create(name="notify")
    first = outbox.enqueue("widget.created", {"id": widget.pk})
    second = outbox.enqueue("widget.created", {"id": widget.pk, "again": True})
    if request.data.get("raise"):
        raise RuntimeError("boom after enqueue")
    code = int(request.data.get("status", 201))
    return Response(
        {"messages": [first.pk, second.pk], "keys": [first.dedup_key, second.dedup_key]},
        status=code,
    )


@api_view(["POST"])
@permission_classes([AllowAny])
@idempotent
def anonymous_allowed(request):
    """DRF lets anonymous callers in; the app still refuses keyed anonymous requests."""
    Widget.objects.create(name="anonymous")
    return Response({"ok": True}, status=201)


@idempotent(retention=60)
@api_view(["POST"])
def ship(request):
    """Enqueues one outbox message per execution (retention 60 s)."""
    outbox.enqueue("tests.ship", {"what": request.data.get("what")})
    return Response({"ok": True}, status=201)


@idempotent(phases=["a", "b"], required=False)
@api_view(["POST"])
def phased_optional(request):
    """A phased view whose key is optional: without one, its phases run unprotected."""
    idem = request.idempotency
    if idem.pending("a"):
        with idem.phase("a"):
            Widget.objects.create(name="phase-a")
    if idem.pending("b"):
        with idem.phase("b"):
            Widget.objects.create(name=idem.derive_key("b")[:20])
    return Response({"ok": True}, status=201)


@idempotent(lease=5)
@api_view(["POST"])
def notify_slow(request):
    """Enqueues a message (default dedup key), then holds at the gate, uncommitted."""
    widget = Widget.objects.create(name="notify-slow")
    message = outbox.enqueue("widget.created", {"id": widget.pk})
    _gate(request)
    return Response({"message": message.pk, "key": message.dedup_key}, status=201)


# --- The view's own transaction outcomes (tests/transactions/test_view_transactions.py) ----------


@api_view(["POST"])
@idempotent
def rolls_back(request):
    """Writes a Widget, then asks for its transaction to roll back and answers 402."""
    from django.db import transaction

    Widget.objects.create(name="rolled-back")
    _gate(request)
    transaction.set_rollback(True)
    return Response({"detail": "payment required"}, status=402)


@api_view(["POST"])
@idempotent
def deferred_violation(request):
    """Writes a Widget and a Token for a user that does not exist: the foreign key is
    deferred (DEFERRABLE INITIALLY DEFERRED), so the violation surfaces at COMMIT."""
    from rest_framework.authtoken.models import Token

    Widget.objects.create(name="deferred")
    _gate(request)
    Token.objects.create(user_id=987654321)
    return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent
def caught_error(request):
    """Writes a Widget, then catches a failing statement without a savepoint: on
    PostgreSQL this aborts the transaction; on SQLite it does not."""
    from django.db import DatabaseError, connection

    Widget.objects.create(name="caught")
    _gate(request)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM testapp_widget")
    except DatabaseError:
        return Response({"detail": "lookup failed"}, status=400)
    return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent
def integrity_error(request):
    """Writes a Widget, then a second Token for the caller (one per user): the view's
    own IntegrityError, raised at once and not caught."""
    from rest_framework.authtoken.models import Token

    Widget.objects.create(name="integrity")
    _gate(request)
    Token.objects.create(user=request.user)
    return Response({"ok": True}, status=201)


@idempotent(phases=["a", "b"])
@api_view(["POST"])
def phase_rolls_back(request):
    """Phase "a" writes a Widget and asks for a rollback; the view answers 402."""
    from django.db import transaction

    idem = request.idempotency
    with idem.phase("a"):
        Widget.objects.create(name="phase-rolled-back")
        _gate(request)
        transaction.set_rollback(True)
    return Response({"a_pending": idem.pending("a")}, status=402)


# --- Claims inside an outer transaction (tests/transactions/test_view_transactions.py) -----------

from django.db import transaction as _transaction  # noqa: E402


@api_view(["POST"])
@_transaction.atomic
@idempotent
def atomic_above(request):
    """@transaction.atomic above @idempotent: the claim joins the outer transaction."""
    Widget.objects.create(name="atomic-above")
    _gate(request)
    return Response({"ok": True}, status=201)


@csrf_exempt
@_transaction.atomic
@idempotent
def atomic_above_plain(request: HttpRequest) -> HttpResponse:
    """A plain Django view under @transaction.atomic (session auth)."""
    Widget.objects.create(name="atomic-above-plain")
    return JsonResponse({"ok": True}, status=201)


@api_view(["POST"])
@idempotent
@_transaction.atomic
def atomic_below(request):
    """@transaction.atomic below @idempotent: a savepoint inside the app's block, fine."""
    Widget.objects.create(name="atomic-below")
    return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent(required=False)
def nested_blocks(request):
    """Blocks inside the app's transaction: one that commits, one that fails and is
    caught (its savepoint rolled back), a write between, and a last block right before
    the response (tests/transactions/test_nested_blocks.py)."""
    from django.db import IntegrityError
    from rest_framework.authtoken.models import Token

    with _transaction.atomic():
        Widget.objects.create(name="first")
    try:
        with _transaction.atomic():
            Widget.objects.create(name="rolled-back")
            Token.objects.create(user=request.user)  # one token per user: refused
    except IntegrityError:
        pass
    Widget.objects.create(name="between")
    with _transaction.atomic(), _transaction.atomic():
        last = Widget.objects.create(name="last")
    return Response({"last": last.pk}, status=201)


@idempotent(lease=5)
@api_view(["POST"])
def gate_then_write(request):
    """Holds at the gate before its first write: on SQLite its transaction holds no lock
    there, so another request can take the key over and finish meanwhile."""
    _gate(request)
    Widget.objects.create(name=request.data.get("name", "gated"))
    return Response({"name": request.data.get("name", "gated")}, status=201)


# --- An idempotent view called from inside another one (tests/protocol/test_nested_views.py)


@csrf_exempt
@idempotent
def nested_inner_two_blocks(request: HttpRequest) -> HttpResponse:
    """Two blocks one after the other, as any view may have."""
    with _transaction.atomic():
        Widget.objects.create(name="inner-1")
    with _transaction.atomic():
        Widget.objects.create(name="inner-2")
    return JsonResponse({"ok": True}, status=201)


@api_view(["POST"])
@idempotent
def nested_outer_calls_inner(request):
    """Calls another idempotent view (its own key) inside its transaction, then reads."""
    from django.test import RequestFactory

    inner = RequestFactory().post(
        "/nested/inner", {}, HTTP_IDEMPOTENCY_KEY=request.data["inner_key"]
    )
    inner.user = request.user
    inner._dont_enforce_csrf_checks = True
    inner_response = nested_inner_two_blocks(inner)
    count = Widget.objects.count()  # any statement after the inner view
    return Response({"inner": inner_response.status_code, "count": count}, status=201)


# --- Views whose first statement opens a block (tests/transactions/test_first_block.py)


@api_view(["POST"])
@idempotent(required=False)
def first_block_lock_iterate(request):
    """A block first (its SAVEPOINT is the transaction's first statement), then the
    common batch shape: lock the rows and walk them with ``.iterator()``."""
    with _transaction.atomic():
        Widget.objects.create(name="first")
    names = [w.name for w in Widget.objects.select_for_update().iterator()]
    return Response({"names": names}, status=201)


@api_view(["POST"])
@idempotent(required=False)
def first_block_copy_caught(request):
    """A COPY that fails (bad data) inside a block, caught; a block that closed just
    before it. The view then writes again and answers 201."""
    import psycopg
    from django.db import connection

    Widget.objects.create(name="kept")
    try:
        with _transaction.atomic():
            with _transaction.atomic():
                Widget.objects.create(name="rolled-back")
            with (
                connection.cursor() as cursor,
                cursor.copy("COPY testapp_widget (name, size) FROM STDIN") as copy,
            ):
                copy.write_row(["bad", "not-a-number"])
    except psycopg.Error:
        pass
    Widget.objects.create(name="after")
    return Response({"ok": True}, status=201)


@api_view(["POST"])
@idempotent(required=False, lease=30)
def first_block_block_then(request):
    """A block first (its SAVEPOINT the transaction's first statement), the during_view
    hook, then the outcome asked for in the body: raise, a status, or
    set_rollback(True). The before_block hook runs before anything else."""
    hook = HOOKS.get("before_block")
    if callable(hook):
        hook(request)
    with _transaction.atomic():
        Widget.objects.create(name="first")
    _gate(request)
    mode = request.data.get("mode", "")
    if mode == "raise":
        raise RuntimeError("after the first block")
    if mode == "rollback":
        _transaction.set_rollback(True)
    with _transaction.atomic():
        Widget.objects.create(name="last")
    return Response({"mode": mode}, status=int(request.data.get("status", 201)))


# --- Idempotent views that call idempotent views (tests/protocol/test_nested_views.py) -------


@idempotent
def delegate_inner(request):
    """Writes a Widget and answers 201 with what ``request.idempotency`` says."""
    widget = Widget.objects.create(name="delegate-inner")
    _gate(request)
    idem = request.idempotency
    body = {"id": widget.pk, "key": idem.key, "endpoint": idem.endpoint}
    return Response(body, status=int(request.data.get("status", 201)))


@api_view(["POST"])
@idempotent
def delegate_outer(request):
    """Hands its request to another idempotent view: the same scope."""
    return delegate_inner(request)


class DelegatingView(IdempotentMixin, APIView):
    """A mixin view whose handler delegates to an ``@idempotent`` function."""

    def post(self, request):
        return delegate_inner(request)


@csrf_exempt
@idempotent(endpoint="POST /delegate/own-request")
def own_request_inner(request: HttpRequest) -> HttpResponse:
    """A plain view, called by ``own_request_outer`` with a request of its own."""
    widget = Widget.objects.create(name="own-request-inner")
    return JsonResponse({"id": widget.pk}, status=201)


@api_view(["POST"])
@idempotent(endpoint="POST /delegate/own-request")
def own_request_outer(request):
    """Builds a new request (same key, another body) for a view of the same endpoint."""
    from django.test import RequestFactory

    inner = RequestFactory().post(
        "/somewhere-else", {"rewritten": "yes"}, HTTP_IDEMPOTENCY_KEY=request.idempotency.key
    )
    inner.user = request.user
    response = own_request_inner(inner)
    return Response({"inner": json.loads(response.content)}, status=response.status_code)


@idempotent(endpoint="POST /delegate/inner-endpoint")
def other_endpoint_inner(request):
    """An idempotent function with an endpoint of its own: another scope."""
    Widget.objects.create(name="other-endpoint-inner")
    return Response({"inner": True}, status=201)


@api_view(["POST"])
@idempotent
def delegate_other_endpoint(request):
    """Calls a view of another scope, then answers the status asked for in the body."""
    inner = other_endpoint_inner(request)
    Widget.objects.create(name="other-endpoint-outer")
    body = {"inner": inner.status_code, "endpoint": request.idempotency.endpoint}
    return Response(body, status=int(request.data.get("status", 201)))


DELEGATE_PHASES = ["charged", "shipped"]


@idempotent(phases=DELEGATE_PHASES)
def phased_inner(request):
    """The second phase of ``delegate_phased``'s work."""
    idem = request.idempotency
    if idem.pending("shipped"):
        with idem.phase("shipped"):
            Widget.objects.create(name="shipped")
    return Response({"recovery_point": idem.recovery_point}, status=201)


@idempotent(phases=DELEGATE_PHASES)
@api_view(["POST"])
def delegate_phased(request):
    """Runs the first phase, then hands the request to ``phased_inner`` (same scope)."""
    idem = request.idempotency
    if idem.pending("charged"):
        with idem.phase("charged"):
            Widget.objects.create(name="charged")
    _crash("after:charged")
    return phased_inner(request)
