"""Projects with ATOMIC_REQUESTS = True: the claim still commits on its own."""

from __future__ import annotations

import uuid

import pytest
from django.core import checks
from django.db import connection

from django_idempotency import exceptions, transactions
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def atomic_requests(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)


@pytest.fixture
def token():
    return TokenFactory(user__username="atomic").key


@pytest.mark.postgres
def test_claim_is_visible_to_others_while_the_view_runs(atomic_requests, token, gate):
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(
        lambda: token_client(token).post(
            "/slow", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_X_GATE=gate_name
        )
    )
    assert held.entered.wait(30)
    duplicate = token_client(token).post("/slow", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert duplicate.status_code == 409  # fast 409: the claim committed on its own
    held.opened.set()
    (first,) = runner.join()
    assert first.status_code == 201
    assert Widget.objects.count() == 1


def test_views_are_exempted_and_keyless_paths_stay_atomic(atomic_requests, token):
    from tests.support.testapp import views

    assert "default" in views.slow._non_atomic_requests  # @idempotent above @api_view
    assert "default" in views.plain_view._non_atomic_requests
    client = token_client(token)
    # A keyless request to an optional-key view runs in the per-request transaction
    # Django would have opened: nothing of it stays when the view raises.
    HOOKS["after_optional"] = True
    response = client.post("/optional", {}, format="json")
    assert response.status_code == 500
    assert Widget.objects.count() == 0


def test_mixin_view_is_exempted(atomic_requests):
    from tests.support.testapp.views import WidgetViewSet

    view = WidgetViewSet.as_view({"post": "create"})
    assert "default" in view._non_atomic_requests
    assert "any-alias" in view._non_atomic_requests


def test_w001_for_decorated_class_view_methods(atomic_requests):
    messages = [m for m in checks.run_checks(tags=[checks.Tags.urls]) if m.id.endswith("W001")]
    flagged = {m.obj.rsplit(".", 1)[1] for m in messages}  # dotted paths, as written
    # An APIView with a decorated method, and @idempotent below @api_view: flagged.
    assert {"RebootView", "create_widget", "outcome"} <= flagged
    assert "tests.support.testapp.views.create_widget" in {m.obj for m in messages}
    assert not any("WrappedAPIView" in str(m) for m in messages)
    (function,) = [m for m in messages if m.obj.endswith(".create_widget")]
    assert function.msg.startswith(
        "The @api_view function tests.support.testapp.views.create_widget"
    )
    # @idempotent above @api_view, the mixin, and plain function views: exempt.
    assert not flagged & {"slow", "WidgetViewSet", "plain_view"}
    assert "IdempotentMixin" in messages[0].hint


def test_no_w001_without_atomic_requests():
    messages = [m for m in checks.run_checks(tags=[checks.Tags.urls]) if m.id.endswith("W001")]
    assert messages == []


def test_decorated_class_view_inside_atomic_requests_is_still_correct(atomic_requests, token):
    """Not exempted: the claim joins the request's transaction (W001, and a warning at
    run time); still executes once."""
    widget = Widget.objects.create(name="r")
    client = token_client(token)
    key = str(uuid.uuid4())
    transactions.reset_warnings()
    with pytest.warns(exceptions.OuterTransactionWarning, match="ATOMIC_REQUESTS"):
        first = client.post(
            f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key
        )
    again = client.post(f"/widgets/{widget.pk}/reboot", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 200 and again["Idempotent-Replayed"] == "true"
    widget.refresh_from_db()
    assert widget.size == 1
