"""Django Ninja operations under ``django_idempotency.contrib.ninja`` (docs/ninja.md).

Through Ninja's ``TestClient`` (the operation called as Ninja's URL view) and through
Django's test client with a URLconf mounting the ``NinjaAPI`` (middleware, resolver).
"""

from __future__ import annotations

import importlib
import json
import threading
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from ninja import NinjaAPI, Router
from ninja.testing import TestAsyncClient, TestClient

from django_idempotency.contrib import ninja as contrib_ninja
from django_idempotency.contrib.ninja import (
    auth_principal,
    credential_principal,
    idempotent,
    options_for,
)
from django_idempotency.models import IdempotencyRecord, OutboxMessage
from django_idempotency.protocol.keys import HEADER
from tests.support.ninja_api import api, router
from tests.support.testapp.gates import Gate
from tests.support.testapp.models import Widget

URLS = "tests.support.ninja_api"
PROBLEM = "application/problem+json"

pytestmark = pytest.mark.urls(URLS)


def key() -> str:
    return str(uuid.uuid4())


def bearer(token: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.key}"}


def post(
    path: str, token: Any, idempotency_key: str | None, body: Any = None, **headers: str
) -> Any:
    """POST through Django's test client (the URLconf, the middleware)."""
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    if token is not None:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token.key}"
    if idempotency_key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = idempotency_key
    return Client().post(
        f"/ninja/{path}",
        data=body if body is not None else {"name": "w", "size": 1},
        content_type="application/json",
        **extra,
    )


# --- the public surface ----------------------------------------------------------------


def test_the_public_names_of_the_ninja_integration() -> None:
    module = importlib.import_module("django_idempotency.contrib.ninja")
    assert sorted(module.__all__) == [
        "api_urls",
        "auth_principal",
        "credential_principal",
        "idempotent",
        "options_for",
    ]
    for name in module.__all__:
        assert callable(getattr(module, name))


# --- Ninja's TestClient ----------------------------------------------------------------


@pytest.mark.django_db
def test_first_execution_then_a_byte_exact_replay_through_ninjas_test_client(alice: Any):
    client = TestClient(api)
    headers = {**bearer(alice), HEADER: key()}
    first = client.post("/widgets", json={"name": "a", "size": 2}, headers=headers)
    assert first.status_code == 201, first.content
    assert first.json() == {"id": first.json()["id"], "name": "a", "size": 2}
    assert not first.has_header("Idempotent-Replayed")
    replay = client.post("/widgets", json={"name": "a", "size": 2}, headers=headers)
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay["Content-Type"] == first["Content-Type"]
    assert replay["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1


@pytest.mark.django_db
def test_missing_and_invalid_keys_are_400_problems_and_nothing_runs(alice: Any):
    client = TestClient(api)
    missing = client.post("/widgets", json={"name": "a"}, headers=bearer(alice))
    assert missing.status_code == 400
    assert missing["Content-Type"] == PROBLEM
    assert missing.json()["type"].endswith("missing-key")
    invalid = client.post(
        "/widgets", json={"name": "a"}, headers={**bearer(alice), HEADER: "x" * 300}
    )
    assert invalid.status_code == 400
    assert invalid.json()["type"].endswith("invalid-key")
    assert Widget.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_a_422_problem(alice: Any):
    client = TestClient(api)
    headers = {**bearer(alice), HEADER: key()}
    assert client.post("/widgets", json={"name": "a"}, headers=headers).status_code == 201
    reused = client.post("/widgets", json={"name": "b"}, headers=headers)
    assert reused.status_code == 422
    assert reused["Content-Type"] == PROBLEM
    assert reused.json()["type"].endswith("key-reused")
    assert reused.json()["differs"] == ["body"]
    assert "FINGERPRINT_EXCLUDE" in reused.json()["detail"]
    assert Widget.objects.count() == 1


@pytest.mark.django_db
def test_unauthenticated_gets_ninjas_own_401_before_any_claim():
    client = TestClient(api)
    response = client.post("/widgets", json={"name": "a"}, headers={HEADER: key()})
    assert response.status_code == 401
    assert response.json() == {"detail": "Unauthorized"}  # Ninja's, not a problem
    assert IdempotencyRecord.objects.count() == 0
    assert Widget.objects.count() == 0


@pytest.mark.django_db
def test_an_invalid_body_gets_ninjas_validation_error_before_any_claim(alice: Any):
    client = TestClient(api)
    response = client.post(
        "/widgets", json={"size": "big"}, headers={**bearer(alice), HEADER: key()}
    )
    assert response.status_code == 422
    assert response["Content-Type"] != PROBLEM  # Ninja's validation error
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.django_db
def test_the_principal_is_request_auth_two_users_one_key_two_executions(alice: Any, bob: Any):
    client = TestClient(api)
    shared = key()
    first = client.post("/widgets", json={"name": "a"}, headers={**bearer(alice), HEADER: shared})
    second = client.post("/widgets", json={"name": "a"}, headers={**bearer(bob), HEADER: shared})
    assert first.status_code == second.status_code == 201
    assert not second.has_header("Idempotent-Replayed")
    assert first.json()["id"] != second.json()["id"]
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert principals == {f"auth.user:{alice.user.pk}", f"auth.user:{bob.user.pk}"}


def test_auth_principal_names_the_user_each_kind_of_credential_stands_for(
    db: Any, alice: Any
) -> None:
    import hashlib

    def request(auth: Any, user: Any = None) -> Any:
        return type("Request", (), {"auth": auth, "user": user})()

    user = f"auth.user:{alice.user.pk}"
    assert auth_principal(request(alice.user)) == user
    assert auth_principal(request(alice)) == user  # a token row: its user
    assert auth_principal(request("tok-1", alice.user)) == user  # request.user
    assert auth_principal(request(True, alice.user)) == user
    assert auth_principal(request("tok-1")) is None  # names no user: refused
    assert auth_principal(request(object(), None)) is None
    assert auth_principal(request(None, None)) is None
    digest = hashlib.sha256(b"tok-1").hexdigest()
    assert credential_principal(request("tok-1", alice.user)) == f"credential:{digest}"
    assert credential_principal(request(alice)) == (
        f"authtoken.token:{hashlib.sha256(alice.pk.encode()).hexdigest()}"
    )  # a token row: its primary key is the secret
    assert credential_principal(request(None, alice.user)) is None


@pytest.mark.django_db
def test_credential_principal_scopes_keys_by_the_credentials_digest_never_the_secret():
    client = TestClient(api)
    shared = key()
    one = client.post("/keys", json={"name": "a"}, headers={"X-API-Key": "key-1", HEADER: shared})
    again = client.post("/keys", json={"name": "a"}, headers={"X-API-Key": "key-1", HEADER: shared})
    other = client.post("/keys", json={"name": "a"}, headers={"X-API-Key": "key-2", HEADER: shared})
    assert (one.status_code, again.status_code, other.status_code) == (201, 201, 201)
    assert again["Idempotent-Replayed"] == "true"
    assert not other.has_header("Idempotent-Replayed")
    principals = list(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert len(set(principals)) == 2
    assert not any("key-1" in p or "key-2" in p for p in principals)


@pytest.mark.django_db
def test_without_authentication_a_keyed_request_is_refused_before_running():
    client = TestClient(api)
    response = client.post("/anonymous", json={"name": "a"}, headers={HEADER: key()})
    assert response.status_code == 403
    assert response["Content-Type"] == PROBLEM
    assert response.json()["type"].endswith("no-principal")
    assert Widget.objects.count() == 0


@pytest.mark.django_db
def test_the_endpoint_is_the_operations_route_not_the_resource(alice: Any):
    client = TestClient(api)
    widget = Widget.objects.create(name="w")
    headers = {**bearer(alice), HEADER: key()}
    first = client.put(
        f"/widgets/{widget.pk}/resize", json={"name": "w", "size": 9}, headers=headers
    )
    assert first.status_code == 200, first.content
    assert first.json() == {
        "id": widget.pk,
        "updated": 1,
        "endpoint": "PUT /widgets/{widget_id}/resize",
    }
    replay = client.put(
        f"/widgets/{widget.pk}/resize", json={"name": "w", "size": 9}, headers=headers
    )
    assert replay.content == first.content and replay["Idempotent-Replayed"] == "true"


@pytest.mark.django_db(transaction=True)
def test_an_async_operation_runs_once_and_replays(alice: Any):
    headers = {**bearer(alice), HEADER: key()}
    client = TestAsyncClient(api)
    body = {"name": "async", "size": 3}
    first = async_to_sync(client.post)("/async-widgets", json=body, headers=headers)
    assert first.status_code == 201, first.content
    replay = async_to_sync(client.post)("/async-widgets", json=body, headers=headers)
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    assert Widget.objects.filter(name="async").count() == 1


# --- Django's test client, through the URLconf -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_through_the_urlconf_first_execution_replay_and_the_full_route(alice: Any):
    idempotency_key = key()
    first = post("widgets", alice, idempotency_key)
    assert first.status_code == 201, first.content
    replay = post("widgets", alice, idempotency_key)
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.endpoint == "POST /ninja/widgets"
    assert post("widgets", alice, None).status_code == 400
    assert post("widgets", alice, idempotency_key, {"name": "other"}).status_code == 422


@pytest.mark.django_db(transaction=True)
def test_through_the_urlconf_an_async_operation(alice: Any):
    idempotency_key = key()
    first = post("async-widgets", alice, idempotency_key)
    replay = post("async-widgets", alice, idempotency_key)
    assert first.status_code == replay.status_code == 201
    assert replay.content == first.content and replay["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_unprotected_operations_are_left_alone(alice: Any):
    response = post("unprotected", alice, None)
    assert response.status_code == 201
    assert (
        Client().get("/ninja/widgets", HTTP_AUTHORIZATION=f"Bearer {alice.key}").status_code == 200
    )
    assert IdempotencyRecord.objects.count() == 0


# --- concurrency: a duplicate while the first is in flight -----------------------------


def _in_flight_duplicate(path: str, alice: Any, gate: tuple[str, Gate]) -> None:
    name, held = gate
    idempotency_key = key()
    results: dict[str, Any] = {}

    def first() -> None:
        try:
            results["first"] = post(path, alice, idempotency_key, X_Gate=name)
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.entered.wait(30), "the first request never reached the operation"
        duplicate = post(path, alice, idempotency_key)
        assert duplicate.status_code == 409
        assert duplicate["Content-Type"] == PROBLEM
        assert duplicate.json()["type"].endswith("request-in-flight")
        assert int(duplicate["Retry-After"]) >= 0
    finally:
        held.opened.set()
        thread.join(30)
    assert results["first"].status_code == 201, results["first"].content
    retry = post(path, alice, idempotency_key)
    assert retry.content == results["first"].content
    assert retry["Idempotent-Replayed"] == "true"
    assert held.calls == 1
    assert Widget.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_duplicate_gets_409_with_retry_after(alice: Any, gate: Any):
    _in_flight_duplicate("widgets", alice, gate)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_duplicate_of_an_async_operation_gets_409(alice: Any, gate: Any):
    _in_flight_duplicate("async-widgets", alice, gate)


# --- phases, the outbox, the write guard -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_phases_a_retry_resumes_after_the_finished_phase(alice: Any):
    idempotency_key = key()
    with pytest.raises(RuntimeError, match="between the phases"):
        post("phased", alice, idempotency_key, {"name": "p", "size": 5}, X_Fail="between")
    assert list(Widget.objects.values_list("size", flat=True)) == [0]
    done = post("phased", alice, idempotency_key, {"name": "p", "size": 5})
    assert done.status_code == 201, done.content
    assert list(Widget.objects.values_list("size", flat=True)) == [5]  # created once
    replay = post("phased", alice, idempotency_key, {"name": "p", "size": 5})
    assert replay.content == done.content and replay["Idempotent-Replayed"] == "true"


@pytest.mark.django_db(transaction=True)
def test_the_outbox_message_commits_with_the_operation_once(alice: Any):
    idempotency_key = key()
    first = post("notify", alice, idempotency_key)
    replay = post("notify", alice, idempotency_key)
    assert first.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    message = OutboxMessage.objects.get()
    assert message.topic == "ninja.widget"
    assert message.payload == {"id": first.json()["id"]}
    assert message.dedup_key == first.json()["dedup_key"]


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_the_write_guard_refuses_a_write_beside_the_records_database(alice: Any):
    from django_idempotency.exceptions import CrossDatabaseWrite

    with pytest.raises(CrossDatabaseWrite):
        post("elsewhere", alice, key())
    assert Widget.objects.count() == 0
    assert IdempotencyRecord.objects.using("shard").count() == 0  # released


# --- declaring it wrong ----------------------------------------------------------------


def test_a_streaming_or_safe_only_operation_is_refused_when_declared() -> None:
    from ninja.streaming import JSONL

    local = Router()
    with pytest.raises(TypeError, match="safe methods"):

        @local.get("/read")
        @idempotent
        def read(request: Any) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match="streaming"):

        @local.post("/stream", response=JSONL[int])
        @idempotent
        def stream(request: Any) -> Any:
            yield 1


def test_a_second_idempotent_is_refused() -> None:
    def view(request: Any) -> dict[str, Any]:
        return {}

    with pytest.raises(TypeError, match="already @idempotent"):
        idempotent(idempotent(view))


def test_unknown_options_are_refused() -> None:
    with pytest.raises(TypeError, match="Unknown idempotency option"):
        idempotent(retentoin=5)


# --- above the operation decorator, and a router mounted twice -------------------------


@pytest.mark.django_db
def test_above_the_operation_decorator_and_on_a_router_mounted_twice(alice: Any):
    local = Router()

    @idempotent
    @local.post("/made", response={201: dict[str, Any]})
    def made(request: Any) -> Any:
        from ninja.responses import Status

        return Status(201, {"id": Widget.objects.create(name="made").pk})

    twice = NinjaAPI(urls_namespace=f"twice-{uuid.uuid4().hex}", auth=api.auth)
    twice.add_router("/one", local, url_name_prefix="one")
    twice.add_router("/two", local, url_name_prefix="two")
    client = TestClient(twice)
    for prefix in ("/one", "/two"):
        headers = {**bearer(alice), HEADER: key()}
        first = client.post(f"{prefix}/made", json={}, headers=headers)
        assert first.status_code == 201, first.content
        assert (
            client.post(f"{prefix}/made", json={}, headers=headers)["Idempotent-Replayed"] == "true"
        )
    assert Widget.objects.count() == 2
    assert options_for(local.path_operations["/made"].operations[0]) is not None


# --- OpenAPI -----------------------------------------------------------------------------


def _operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    schema = json.loads(json.dumps(schema))  # as served: status codes as strings
    return {
        (path, method): operation
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    }


def test_openapi_declares_the_header_and_problems_on_protected_operations_only() -> None:
    operations = _operations(api.get_openapi_schema())
    protected = operations[("/ninja/widgets", "post")]
    header = [p for p in protected["parameters"] if p["in"] == "header"]
    assert [(p["name"], p["required"]) for p in header] == [(HEADER, True)]
    assert "Retention window: 24 hours" in header[0]["description"]
    for code in ("400", "409", "422"):
        content = protected["responses"][code]["content"]
        assert PROBLEM in content
        assert list(content) == [PROBLEM] or code == "422"  # and Ninja's validation error
        assert content[PROBLEM]["schema"]["required"] == ["type", "title", "status", "detail"]
    assert "Retry-After" in protected["responses"]["409"]["headers"]
    assert "Idempotent-Replayed" in protected["responses"]["201"]["headers"]
    assert protected["responses"]["201"]["content"]  # Ninja's own response schema kept
    assert protected["x-idempotency"]["header"] == HEADER
    assert protected["x-idempotency"]["required"] is True
    path_operation = operations[("/ninja/widgets/{widget_id}/resize", "put")]
    assert [p["name"] for p in path_operation["parameters"]] == ["widget_id", HEADER]
    for unprotected in (("/ninja/widgets", "get"), ("/ninja/unprotected", "post")):
        operation = operations[unprotected]
        names = [p["name"] for p in operation.get("parameters", [])]
        assert HEADER not in names
        assert not {"400", "409"} & set(operation["responses"])
        assert "x-idempotency" not in operation


def test_the_module_imports_nothing_of_drf_spectacular() -> None:
    assert "drf_spectacular" not in vars(contrib_ninja)
    assert router.path_operations  # the test API is built


# --- ATOMIC_REQUESTS: api_urls ---------------------------------------------------------


@pytest.fixture
def atomic_requests(monkeypatch: Any, settings: Any) -> None:
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    monkeypatch.setitem(settings.DATABASES["default"], "ATOMIC_REQUESTS", True)


@pytest.mark.django_db(transaction=True)
def test_with_atomic_requests_plain_api_urls_claim_inside_the_request_transaction(
    alice: Any, atomic_requests: None
):
    from django_idempotency.exceptions import OuterTransactionWarning

    with pytest.warns(OuterTransactionWarning, match="inside a transaction"):
        post("widgets", alice, key())


@pytest.mark.urls("tests.support.ninja_atomic_urls")
@pytest.mark.django_db(transaction=True)
def test_with_atomic_requests_api_urls_claims_first_and_keeps_the_others_atomic(
    alice: Any, atomic_requests: None
):
    idempotency_key = key()
    first = post("widgets", alice, idempotency_key)  # no OuterTransactionWarning
    assert first.status_code == 201, first.content
    replay = post("widgets", alice, idempotency_key)
    assert replay.content == first.content and replay["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
    with pytest.raises(RuntimeError, match="after its write"):
        post("unprotected-fails", alice, None, {"name": "rolled back"})
    assert not Widget.objects.filter(name="rolled back").exists()  # ATOMIC_REQUESTS kept
    assert post("unprotected", alice, None).status_code == 201


@pytest.mark.postgres
@pytest.mark.urls("tests.support.ninja_atomic_urls")
@pytest.mark.django_db(transaction=True)
def test_with_atomic_requests_api_urls_a_concurrent_duplicate_gets_409(
    alice: Any, gate: Any, atomic_requests: None
):
    _in_flight_duplicate("widgets", alice, gate)


# --- OpenAPI: Ninja's validation 422 beside the problem ----------------------------------


def test_openapi_422_describes_ninjas_validation_error_beside_the_key_reused_problem() -> None:
    from django_idempotency.contrib.ninja_openapi import VALIDATION_ERROR_SCHEMA

    protected = _operations(api.get_openapi_schema())[("/ninja/widgets", "post")]
    content = protected["responses"]["422"]["content"]
    assert sorted(content) == ["application/json", PROBLEM]
    assert content["application/json"]["schema"] == VALIDATION_ERROR_SCHEMA
    assert content[PROBLEM]["schema"]["required"] == ["type", "title", "status", "detail"]
    assert "validation" in protected["responses"]["422"]["description"]


def test_openapi_a_declared_422_keeps_its_schema_beside_the_problem() -> None:
    from ninja import Schema

    class Refused(Schema):
        reason: str

    local = Router()

    @local.post("/declared", response={201: dict[str, Any], 422: Refused})
    @idempotent
    def declared(request: Any, payload: dict[str, Any]) -> Any:
        return {}

    declaring = NinjaAPI(urls_namespace=f"declared-{uuid.uuid4().hex}")
    declaring.add_router("/", local)
    schema = declaring.get_openapi_schema(path_prefix="/api/")
    content = _operations(schema)[("/api/declared", "post")]["responses"]["422"]["content"]
    assert sorted(content) == ["application/json", PROBLEM]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/Refused"}
