from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin, idempotent

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
async def async_view(request: HttpRequest) -> HttpResponse:
    widget = await Widget.objects.acreate(name="async")
    return JsonResponse({"id": widget.pk}, status=201)
