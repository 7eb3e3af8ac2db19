from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("vs/widgets", views.WidgetViewSet)

urlpatterns = [
    path("widgets", views.create_widget),
    path("widgets/<int:pk>", views.delete_widget),
    path("widgets/<int:pk>/reboot", views.RebootView.as_view()),
    path("labels/<str:name>", views.label),
    path("large-body", views.large_body),
    path("optional", views.optional_key),
    path("outcome", views.outcome),
    path("waiting", views.waiting),
    path("slow", views.slow),
    path("gate-then-write", views.gate_then_write),
    path("heartbeat", views.heartbeat),
    path("auto-heartbeat", views.auto_heartbeat),
    path("release-503", views.release_503),
    path("plain", views.plain_view),
    path("stream", views.streaming_view),
    path("async", views.async_view),
    path("anonymous", views.anonymous_allowed),
    path("provision", views.provision),
    path("notify", views.notify),
    path("ship", views.ship),
    path("phased-optional", views.phased_optional),
    path("notify-slow", views.notify_slow),
    *router.urls,
    path("tx/rolls-back", views.rolls_back),
    path("tx/deferred", views.deferred_violation),
    path("tx/caught", views.caught_error),
    path("tx/integrity", views.integrity_error),
    path("tx/phase-rolls-back", views.phase_rolls_back),
    path("tx/atomic-above", views.atomic_above),
    path("tx/atomic-above-plain", views.atomic_above_plain),
    path("tx/atomic-below", views.atomic_below),
    path("tx/nested-blocks", views.nested_blocks),
    path("tx/streaming-dooms", views.streaming_dooms),
    path("nested/inner", views.nested_inner_two_blocks),
    path("nested/outer", views.nested_outer_calls_inner),
    path("first-block/lock-iterate", views.first_block_lock_iterate),
    path("first-block/copy-caught", views.first_block_copy_caught),
    path("first-block/block-then", views.first_block_block_then),
    path("delegate/outer", views.delegate_outer),
    path("delegate/mixin", views.DelegatingView.as_view()),
    path("delegate/own-request", views.own_request_outer),
    path("delegate/other-endpoint", views.delegate_other_endpoint),
    path("delegate/phased", views.delegate_phased),
]
