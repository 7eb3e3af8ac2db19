"""Idempotent views that call idempotent views (docs/faq.md, "Can an idempotent view call
another one?").

A view that hands its request (or a request of its own with the same scope: principal,
endpoint, key) to another idempotent view runs the inner one once, as part of its own
execution: no second claim, the inner's writes in the outer's transaction, the outer's
response stored. A call of another scope is a claim of its own, nested in the outer's
transaction. The same holds for ``inbox.once`` blocks (tests/inbox/test_calls.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


def _records() -> list[tuple[str, str]]:
    return sorted(IdempotencyRecord.objects.values_list("endpoint", "state"))


@pytest.mark.parametrize("url", ["/delegate/outer", "/delegate/mixin"])
def test_a_view_delegating_to_an_idempotent_view_runs_it_once(api, key, url):
    """An ``@idempotent`` view (or an ``IdempotentMixin`` handler) that returns another
    ``@idempotent`` view's answer for its own request gets that answer on the first
    attempt, not a 409 ``request-in-flight`` of its own making; the inner view ran once,
    one record holds the response, and a retry replays it."""
    first = api.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["key"] == key and body["endpoint"] == f"POST /{url.lstrip('/')}"
    assert _records() == [(f"POST /{url.lstrip('/')}", RecordState.COMPLETED)]
    again = api.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == body
    assert Widget.objects.filter(name="delegate-inner").count() == 1


def test_a_delegated_view_whose_status_releases_releases_the_outer_key(api, key):
    """The inner view's answer is the outer's: a 503 from it releases the one claim, and
    a retry runs the inner view again."""
    failed = api.post("/delegate/outer", {"status": 503}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert failed.status_code == 503
    assert _records() == [] and Widget.objects.count() == 0
    retried = api.post("/delegate/outer", {"status": 503}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retried.status_code == 503 and "Idempotent-Replayed" not in retried


def test_a_delegated_view_with_a_request_of_its_own_runs_under_the_outer_claim(api, key):
    """The inner view gets a request built by the outer one (another path and body, the
    same key and endpoint): the same scope, so it runs under the outer claim; the record
    keeps the outer request's fingerprint, so a retry of the client's request replays."""
    first = api.post("/delegate/own-request", {"n": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    assert _records() == [("POST /delegate/own-request", RecordState.COMPLETED)]
    again = api.post("/delegate/own-request", {"n": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    other = api.post("/delegate/own-request", {"n": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert other.status_code == 422  # the client's request is what the key identifies
    assert Widget.objects.filter(name="own-request-inner").count() == 1


def test_a_delegated_view_of_another_scope_commits_its_record_with_the_outer(api):
    """An inner view with an endpoint of its own is a claim of its own, made in the
    outer's transaction: both records commit together with both views' writes, and when
    the outer view releases its key, the inner's record and writes roll back with it.
    Once the inner view returned, the outer's ``request.idempotency`` is its own again."""
    key = str(uuid.uuid4())
    response = api.post("/delegate/other-endpoint", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201
    assert response.json() == {"inner": 201, "endpoint": "POST /delegate/other-endpoint"}
    assert _records() == [
        ("POST /delegate/inner-endpoint", RecordState.COMPLETED),
        ("POST /delegate/other-endpoint", RecordState.COMPLETED),
    ]
    released = str(uuid.uuid4())
    failed = api.post(
        "/delegate/other-endpoint", {"status": 503}, format="json", HTTP_IDEMPOTENCY_KEY=released
    )
    assert failed.status_code == 503
    assert IdempotencyRecord.objects.filter(key=released).count() == 0
    assert Widget.objects.count() == 2  # the first request's two; the second's rolled back


def test_a_phased_view_delegating_to_a_phased_view_resumes_inside_it(api, key):
    """A phased view that runs its first phase and hands the request to a phased view
    of the same scope for the second: after a crash between the two, the retry takes
    the claim over, skips the finished phase and runs the inner view's phase once."""
    HOOKS["crash"] = "after:charged"
    api.raise_request_exception = False
    crashed = api.post("/delegate/phased", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert crashed.status_code == 500
    retried = api.post("/delegate/phased", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retried.status_code == 201, retried.content
    assert retried.json() == {"recovery_point": "shipped"}
    record = IdempotencyRecord.objects.get()
    assert (record.state, record.recovery_point) == (RecordState.COMPLETED, "shipped")
    names = sorted(Widget.objects.values_list("name", flat=True))
    assert names == ["charged", "shipped"]


@pytest.mark.postgres
def test_a_duplicate_of_a_delegating_view_in_flight_gets_409(alice, gate):
    """While the delegating view runs (held inside the inner view), a duplicate gets the
    409 ``request-in-flight`` of the outer claim; the original then completes, and the
    inner view ran once."""
    name, gate_obj = gate
    key = str(uuid.uuid4())

    def post(**extra: Any) -> Any:
        return token_client(alice.key).post(
            "/delegate/outer", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra
        )

    runner = Runner()
    try:
        runner.start(lambda: post(HTTP_X_GATE=name))
        assert gate_obj.entered.wait(30)
        duplicate = post()
        assert duplicate.status_code == 409
        assert duplicate.json()["type"].endswith("#request-in-flight")
        gate_obj.opened.set()
        (original,) = runner.join()
    finally:
        gate_obj.opened.set()
    assert original.status_code == 201, original.content
    assert gate_obj.calls == 1 and Widget.objects.filter(name="delegate-inner").count() == 1


def test_a_request_routed_while_the_view_runs_is_a_request_of_its_own(api, alice, key):
    """A request with the same key that Django's URL resolver routes while the view runs
    (here the test client called from inside the view, as an in-process client would)
    is not part of the view's execution: it is a duplicate, answered 409, and the view
    runs once."""
    from tests.support.clients import client_for

    answers: list[int] = []

    def duplicate(request: Any) -> None:
        HOOKS.pop("during_view")
        answers.append(
            client_for(alice)
            .post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
            .status_code
        )

    HOOKS["during_view"] = duplicate
    response = api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201 and answers == [409]
    assert Widget.objects.count() == 1


@pytest.mark.postgres
def test_an_idempotent_view_called_inside_another_runs_both_once():
    """docs/faq.md: an idempotent view called from inside another one's transaction is
    supported (the app's own blocks are not outer blocks). The inner view has two blocks
    one after the other; the outer one runs a statement after it returns."""
    token = TokenFactory(user__username="nested-views")
    client = token_client(token.key)
    client.raise_request_exception = False
    response = client.post(
        "/nested/outer",
        {"inner_key": str(uuid.uuid4())},
        format="json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
    )
    assert response.status_code == 201, response.content
    assert response.json() == {"inner": 201, "count": 2}
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["inner-1", "inner-2"]
    assert sorted(IdempotencyRecord.objects.values_list("state", flat=True)) == [
        "completed",
        "completed",
    ]
