"""Security: isolation between principals, secrets never stored, keys never logged,
and the ``BODY_CODEC`` hook for stored bodies (docs/security.md)."""

from __future__ import annotations

import json
import logging
import traceback
import uuid
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.principals import auth_token_principal
from django_idempotency.protocol.begin import fit as _fit
from tests.support.clients import client_for
from tests.support.factories import TokenFactory
from tests.support.faults import RouteTo, extra_alias, unreachable
from tests.support.robustness_app import SECRET_HEADER_VALUE, TOY_CODEC
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

__all__ = ["extra_alias"]  # a fixture

pytestmark = pytest.mark.urls("tests.support.robustness_app")

TENANT = {"PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal"}
printable = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


# --- No principal ever receives another principal's stored response -----------------

principals = st.lists(
    st.one_of(
        st.text(printable, min_size=1, max_size=40),
        # longer than the column: shortened with a digest, never truncated into another
        st.text(printable, min_size=1, max_size=8).map(lambda t: "p" * 250 + t),
    ),
    min_size=2,
    max_size=4,
    unique=True,
)
operations = st.lists(
    st.tuples(
        st.integers(0, 3),  # principal
        st.integers(0, 2),  # key
        st.sampled_from(["POST", "PUT", "PATCH"]),  # endpoint
        st.sampled_from([b"a", b"b"]),  # body
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.django_db
@override_settings(IDEMPOTENCY=TENANT)
@settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(names=principals, ops=operations)
def test_no_principal_ever_receives_another_principals_response(names, ops) -> None:
    keys = [f"k{i}-{uuid.uuid4()}" for i in range(3)]
    model: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}
    for who, which_key, method, body in ops:
        name = names[who % len(names)]
        key = keys[which_key]
        response = Client(HTTP_X_TENANT=name).generic(
            method, "/r/raw", body, content_type="text/plain", HTTP_IDEMPOTENCY_KEY=key
        )
        scope = (name, method, key)
        if response.status_code == 422:
            assert scope in model and model[scope][0] != body
            continue
        assert response.status_code == 201, response.content
        answer = json.loads(response.content)
        assert answer["principal"] == _fit(name)  # executed or replayed: always our own
        if scope in model:
            assert model[scope][0] == body
            assert response["Idempotent-Replayed"] == "true"
            assert response.content == model[scope][1]
        else:
            assert "Idempotent-Replayed" not in response
            model[scope] = (body, response.content)
    assert IdempotencyRecord.objects.filter(key__in=keys).count() == len(model)


@pytest.mark.django_db
@settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=10
    )
)
def test_authenticated_users_never_receive_each_others_responses(ops) -> None:
    users = [TokenFactory(user__username=f"s{uuid.uuid4().hex[:12]}") for _ in range(3)]
    keys = [str(uuid.uuid4()) for _ in range(2)]
    for who, which_key, tag in ops:
        token = users[who]
        response = client_for(token).post(
            "/r/echo", {"tag": tag}, format="json", HTTP_IDEMPOTENCY_KEY=keys[which_key]
        )
        assert response.status_code in (201, 422)
        if response.status_code == 201:
            assert json.loads(response.content)["user"] == token.user.username


def test_auth_token_principal_never_stores_the_credential() -> None:
    class Request:
        auth = "eyJhbGciOiJIUzI1NiJ9.secret-jwt-payload.sig"

    principal = auth_token_principal(Request())
    assert principal is not None and principal.startswith("credential:")
    assert "secret-jwt" not in principal and len(principal) < 255


# --- Secrets are never stored -------------------------------------------------------

REQUEST_COOKIE = "sessionid=request-cookie-secret-8a1e"
RESPONSE_SECRETS = [
    "cookie-secret-71d0",
    "secret-realm-5e1a",
    "authz-secret-33b7",
    "proxy-secret-0c4d",
    SECRET_HEADER_VALUE,
    "request-cookie-secret-8a1e",
]


def record_text(record: IdempotencyRecord) -> str:
    """Every column of the record, as text (bodies decoded leniently)."""
    values = IdempotencyRecord.objects.filter(pk=record.pk).values().get()
    return " ".join(
        bytes(v).decode("latin-1") if isinstance(v, (bytes, memoryview)) else str(v)
        for v in values.values()
    )


@pytest.mark.django_db
@override_settings(
    IDEMPOTENCY={
        # configured, but credentials and cookies are never stored whatever the setting
        "REPLAY_HEADERS": [
            "Set-Cookie",
            "Authorization",
            "WWW-Authenticate",
            "Proxy-Authenticate",
            "Cookie",
            "X-Widget-Version",
        ],
        # a project's own secret header: denied by prefix
        "REPLAY_DENY_HEADERS": ["X-Api-*"],
        # hashed into the fingerprint, never stored as such
        "FINGERPRINT_HEADERS": ["Authorization", "Cookie"],
    }
)
def test_credentials_cookies_and_denied_headers_are_never_stored(alice, key) -> None:
    api = client_for(alice)
    first = api.post(
        "/r/secrets", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_COOKIE=REQUEST_COOKIE
    )
    assert first.status_code == 201 and first.cookies["sessionid"].value == "cookie-secret-71d0"
    record = IdempotencyRecord.objects.get(key=key)
    stored = {name.lower() for name, _ in record.response_headers}
    assert {"content-type", "x-widget-version"} <= stored
    assert not stored & {"set-cookie", "authorization", "www-authenticate", "x-api-secret"}
    text = record_text(record)
    for secret in [alice.key, *RESPONSE_SECRETS]:
        assert secret not in text
    replay = api.post(
        "/r/secrets", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_COOKIE=REQUEST_COOKIE
    )
    assert replay["Idempotent-Replayed"] == "true" and replay["X-Widget-Version"] == "v7"
    for header in (
        "Set-Cookie",
        "Authorization",
        "WWW-Authenticate",
        "Proxy-Authenticate",
        "X-Api-Secret",
    ):
        assert header not in replay
    assert "sessionid" not in replay.cookies


# --- Full keys are never logged at INFO or above -------------------------------------


def _all_text(record: logging.LogRecord) -> str:
    parts = [record.getMessage(), *(str(v) for v in vars(record).values())]
    if record.exc_info:
        parts.append("".join(traceback.format_exception(*record.exc_info)))
    return "\n".join(parts)


@pytest.mark.django_db(transaction=True)
def test_keys_are_never_logged_at_info_or_above(alice, caplog, on_postgres, extra_alias) -> None:
    caplog.set_level(logging.DEBUG)
    api = client_for(alice)
    api.raise_request_exception = False
    tenant = Client(raise_request_exception=False, HTTP_X_TENANT="t-logs")
    key = f"full-key-{uuid.uuid4().hex}"
    body = {"name": "a"}

    def send(data: Any = body, url: str = "/widgets", k: str = key, **extra: Any) -> Any:
        return api.post(url, data, format="json", HTTP_IDEMPOTENCY_KEY=k, **extra)

    statuses = [send().status_code, send().status_code]  # 201, replay
    statuses.append(send({"name": "b"}).status_code)  # 422
    statuses.append(send(k=key + ",second").status_code)  # 400: duplicate header
    statuses.append(send(k=key + "\x00").status_code)  # 400: control character
    statuses.append(send(k=key * 10).status_code)  # 400: too long
    statuses.append(
        Client(raise_request_exception=False)
        .post("/plain", {}, HTTP_IDEMPOTENCY_KEY=key)
        .status_code
    )  # 401 or 403: no principal
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10):
        statuses.append(send({"name": "x" * 100}, k=key + "-big").status_code)  # 413
    statuses.append(send({"status": 503}, "/outcome", key + "-5xx").status_code)  # released
    statuses.append(send({"raise": True}, "/outcome", key + "-raise").status_code)  # 500
    # in flight: a live claim held by someone else
    send({"status": 201}, "/outcome", key + "-busy")
    IdempotencyRecord.objects.filter(key=key + "-busy").update(
        state=RecordState.CLAIMED, owner_token=uuid.uuid4(), response_status=None
    )
    IdempotencyRecord.objects.filter(key=key + "-busy").update(
        lease_until=IdempotencyRecord.objects.get(key=key + "-busy").expires_at
    )
    statuses.append(send({"status": 201}, "/outcome", key + "-busy").status_code)  # 409

    # lease lost: another owner takes the record while the view runs
    def steal(request: Any) -> None:
        IdempotencyRecord.objects.filter(key=key + "-lost").update(owner_token=uuid.uuid4())

    HOOKS["during_view"] = steal
    statuses.append(send(url="/widgets", k=key + "-lost").status_code)  # 409 lease lost
    del HOOKS["during_view"]
    # the store unreachable, and a stored response too large to replay
    down = extra_alias(**unreachable(on_postgres))
    with override_settings(DATABASE_ROUTERS=[RouteTo(down)]):
        statuses.append(send(k=key + "-down").status_code)  # 503
    with override_settings(IDEMPOTENCY={**TENANT, "MAX_RESPONSE_BYTES": 10}):
        for _ in range(2):
            statuses.append(
                tenant.post("/r/sized?n=100", HTTP_IDEMPOTENCY_KEY=key + "-huge").status_code
            )
    assert {201, 422, 400, 413, 503, 500, 409, 410} <= set(statuses), statuses
    assert {401, 403} & set(statuses), statuses
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert loud, "expected some log lines at INFO or above"
    for record in loud:
        assert key not in _all_text(record), (record.name, record.getMessage())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_keys_are_not_logged_when_the_connection_dies(alice, caplog) -> None:
    from tests.support.faults import terminate

    caplog.set_level(logging.DEBUG)
    key = f"full-key-{uuid.uuid4().hex}"
    from django.db import connection

    HOOKS["during_view"] = lambda request: terminate(connection.connection.info.backend_pid)
    response = client_for(alice).post(
        "/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code == 503
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert loud
    for record in loud:
        assert key not in _all_text(record)


# --- BODY_CODEC: stored bodies encoded at rest ---------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("codec", [TOY_CODEC, "tests.support.robustness_app.TOY_CODEC"])
def test_body_codec_encodes_the_stored_body_and_decodes_the_replay(codec: Any) -> None:
    client = Client(HTTP_X_TENANT="t-codec")
    with override_settings(IDEMPOTENCY={**TENANT, "BODY_CODEC": codec}):
        first = client.post("/r/sized?n=300", HTTP_IDEMPOTENCY_KEY="k")
        again = client.post("/r/sized?n=300", HTTP_IDEMPOTENCY_KEY="k")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    stored = bytes(IdempotencyRecord.objects.get(principal="t-codec").response_body)
    assert stored.startswith(b"toy1:") and first.content not in stored
    assert TOY_CODEC.decode(stored) == first.content


@pytest.mark.django_db
def test_body_codec_enabled_later_still_reads_older_rows() -> None:
    client = Client(HTTP_X_TENANT="t-codec-later")
    with override_settings(IDEMPOTENCY=TENANT):
        first = client.post("/r/sized?n=50", HTTP_IDEMPOTENCY_KEY="k")
    with override_settings(IDEMPOTENCY={**TENANT, "BODY_CODEC": TOY_CODEC}):
        again = client.post("/r/sized?n=50", HTTP_IDEMPOTENCY_KEY="k")
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.filter(name="sized").count() == 1


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore::django_idempotency.exceptions.OuterTransactionWarning")
def test_max_response_bytes_counts_the_plain_body_not_the_encoded_one() -> None:
    client = Client(HTTP_X_TENANT="t-codec-cap")
    config = {**TENANT, "BODY_CODEC": TOY_CODEC, "MAX_RESPONSE_BYTES": 100}
    with override_settings(IDEMPOTENCY=config), transaction.atomic():
        client.post("/r/sized?n=100", HTTP_IDEMPOTENCY_KEY="k")  # 100 + 5 bytes stored
        again = client.post("/r/sized?n=100", HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
def test_admin_shows_the_decoded_body_and_marks_a_dropped_one(admin_client) -> None:
    client = Client(HTTP_X_TENANT="t-admin")
    config = {**TENANT, "BODY_CODEC": TOY_CODEC, "MAX_RESPONSE_BYTES": 100}
    with override_settings(IDEMPOTENCY=config):
        kept = client.post("/r/sized?n=20", HTTP_IDEMPOTENCY_KEY="kept")
        client.post("/r/sized?n=200", HTTP_IDEMPOTENCY_KEY="dropped")
        pages = {
            record.key: admin_client.get(
                f"/admin/django_idempotency/idempotencyrecord/{record.pk}/change/"
            )
            for record in IdempotencyRecord.objects.filter(principal="t-admin")
        }
    assert pages["kept"].status_code == 200
    assert kept.content.decode() in pages["kept"].content.decode()
    assert "not kept: larger than MAX_RESPONSE_BYTES" in pages["dropped"].content.decode()
