"""Webhook receivers: the key from a body field or another header, the principal from a
verified signature (docs/inbox.md). The rest is the protocol of every view: one
execution, replay, 422 on another payload under the same event id, 409 in flight."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from typing import Any

import pytest
from django.db import connections
from django.test import Client, RequestFactory

from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord
from django_idempotency.principals import hmac_signature, sign
from tests.support.testapp.models import Widget
from tests.support.webhook_app import SECRET

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.webhook_app")]


def deliver(
    path: str,
    event: dict[str, Any],
    *,
    secret: str = SECRET,
    signature_header: str = "HTTP_X_TEST_SIGNATURE",
    **headers: str,
) -> Any:
    body = json.dumps(event).encode()
    headers.setdefault(signature_header, sign(secret, body))
    return Client().post(path, body, content_type="application/json", **headers)  # fmt: skip


def slug(response: Any) -> str:
    assert response["Content-Type"] == "application/problem+json"
    return str(json.loads(response.content)["type"]).removeprefix(conf.problem_type_base)


EVENT = {"id": "evt_1Nq", "type": "charge.succeeded", "data": {"amount": 1200}}


def test_a_stripe_style_event_id_in_the_body_runs_once_and_replays():
    first = deliver("/hooks/stripe", EVENT)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    again = deliver("/hooks/stripe", {**EVENT})  # the sender's redelivery
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.principal, record.key) == ("webhook:stripe", "evt_1Nq")
    assert record.endpoint == "POST /hooks/stripe"


def test_the_same_event_id_with_another_payload_is_422():
    assert deliver("/hooks/stripe", EVENT).status_code == 201
    changed = deliver("/hooks/stripe", {**EVENT, "data": {"amount": 9999}})
    assert changed.status_code == 422 and slug(changed) == "key-reused"
    # The key came from the body, not from a header: the problem names no header.
    assert changed.json()["title"] == "Idempotency key reused with a different request"
    assert "Idempotency-Key" not in changed.json()["detail"]
    assert changed.json()["differs"] == ["body"]
    assert b"9999" not in changed.content
    assert Widget.objects.get().size == 1200


def test_a_github_style_delivery_header_is_the_key():
    headers = {"HTTP_X_GITHUB_DELIVERY": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    body = {"action": "opened"}
    sig = {"signature_header": "HTTP_X_HUB_SIGNATURE_256"}
    first = deliver("/hooks/github", body, **sig, **headers)
    again = deliver("/hooks/github", body, **sig, **headers)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again["Idempotent-Replayed"] == "true" and Widget.objects.count() == 1
    other = deliver("/hooks/github", body, **sig, HTTP_X_GITHUB_DELIVERY="another-delivery")
    assert other.status_code == 202 and "Idempotent-Replayed" not in other
    assert Widget.objects.count() == 2


def test_an_idempotency_key_header_is_ignored_where_the_key_comes_from_the_body():
    first = deliver("/hooks/stripe", EVENT, HTTP_IDEMPOTENCY_KEY="k1")
    again = deliver("/hooks/stripe", EVENT, HTTP_IDEMPOTENCY_KEY="k2")
    assert again["Idempotent-Replayed"] == "true" and first.status_code == 201
    assert IdempotencyRecord.objects.get().key == "evt_1Nq"


def test_a_drf_receiver_reads_a_nested_body_field():
    event = {"data": {"event_id": "msg_2b"}}
    first = deliver("/hooks/drf", event)
    again = deliver("/hooks/drf", event)
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1


def test_a_drf_redelivery_asking_for_an_unrenderable_type_gets_the_stored_response(
    monkeypatch: pytest.MonkeyPatch,
):
    import rest_framework

    from django_idempotency.protocol.drf import ReplayNegotiation
    from tests.support import webhook_app

    if tuple(int(part) for part in rest_framework.VERSION.split(".")[:2]) < (3, 17):
        # Before 3.17, @idempotent below @api_view needs the documented setting
        # (docs/protocol.md), read when DRF defines APIView: give the class what it gives.
        monkeypatch.setattr(
            webhook_app.drf_receiver.cls, "content_negotiation_class", ReplayNegotiation
        )
    event = {"data": {"event_id": "msg_accept"}}
    first = deliver("/hooks/drf", event)
    again = deliver("/hooks/drf", event, HTTP_ACCEPT="application/xml")
    assert first.status_code == 201 and again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    fresh = deliver("/hooks/drf", {"data": {"event_id": "msg_new"}}, HTTP_ACCEPT="text/csv")
    assert fresh.status_code == 406  # the view would have to run: DRF's answer, nothing run
    assert Widget.objects.count() == 1


def test_a_combined_key_joins_its_parts():
    first = deliver("/hooks/combined", EVENT, HTTP_X_SOURCE="eu")
    other_source = deliver("/hooks/combined", EVENT, HTTP_X_SOURCE="us")
    assert first.status_code == other_source.status_code == 201
    assert sorted(IdempotencyRecord.objects.values_list("key", flat=True)) == [
        "eu:evt_1Nq",
        "us:evt_1Nq",
    ]
    missing = deliver("/hooks/combined", EVENT)
    assert missing.status_code == 400 and slug(missing) == "missing-key"
    assert "X-Source header" in json.loads(missing.content)["detail"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"not json", "is not JSON"),
        (b"[1, 2]", "no JSON object"),
        (b'{"id": {"nested": 1}}', "must be a string"),
        (b'{"id": ""}', "is empty"),
        (b'{"id": true}', "must be a string"),
        ('{"id": "caf\u00e9"}'.encode(), "printable ASCII"),
        (json.dumps({"id": "x" * 300}).encode(), "characters long"),
    ],
)
def test_an_unusable_extracted_key_is_a_400_invalid_key(body, detail):
    response = Client().post("/hooks/stripe", body, content_type="application/json",
                             HTTP_X_TEST_SIGNATURE=sign(SECRET, body))  # fmt: skip
    assert response.status_code == 400 and slug(response) == "invalid-key"
    problem = json.loads(response.content)
    assert detail in problem["detail"] and "'id' field" in problem["detail"]
    assert problem["title"] == "Invalid idempotency key"
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


def test_an_extracted_key_names_a_refused_character_as_the_client_sent_it():
    """A key header's value arrives decoded as ISO-8859-1 (the test client, like a WSGI
    server, hands over ``café``'s UTF-8 bytes as ``cafÃ©``): the 400 names ``'é'`` and
    its bytes. A key from a JSON body is real text: its character is named as it is."""
    github = deliver(
        "/hooks/github", {"zen": "hi"}, signature_header="HTTP_X_HUB_SIGNATURE_256",
        HTTP_X_GITHUB_DELIVERY="caf\u00e9".encode().decode("latin-1"),
    )  # fmt: skip
    assert github.status_code == 400 and slug(github) == "invalid-key"
    assert "the character 'é' (UTF-8 bytes C3 A9)" in github.json()["detail"]
    body = '{"id": "caf\u00e9"}'.encode()
    stripe = Client().post("/hooks/stripe", body, content_type="application/json",
                           HTTP_X_TEST_SIGNATURE=sign(SECRET, body))  # fmt: skip
    assert stripe.status_code == 400 and "the character 'é'." in stripe.json()["detail"]
    assert IdempotencyRecord.objects.count() == 0


def test_a_missing_extracted_key_is_a_400_missing_key():
    response = deliver("/hooks/stripe", {"type": "ping"})
    assert response.status_code == 400 and slug(response) == "missing-key"
    problem = json.loads(response.content)
    assert problem["title"] == "Idempotency key required"
    assert "'id' field of the JSON body" in problem["detail"]
    assert Widget.objects.count() == 0


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_key_header_is_no_key(blank):
    """A key header that is present but blank carries no key: 400 ``missing-key``
    naming the header, nothing claimed, never a key made of nothing. In a combined key
    too: a blank part is a missing part, so a blank ``X-Source`` never turns the event
    id alone (``":evt_1Nq"``) into a key."""
    github = deliver(
        "/hooks/github", {"zen": "hi"}, signature_header="HTTP_X_HUB_SIGNATURE_256",
        HTTP_X_GITHUB_DELIVERY=blank,
    )  # fmt: skip
    assert github.status_code == 400 and slug(github) == "missing-key"
    assert "X-GitHub-Delivery header" in json.loads(github.content)["detail"]
    combined = deliver("/hooks/combined", EVENT, HTTP_X_SOURCE=blank)
    assert combined.status_code == 400 and slug(combined) == "missing-key"
    assert "X-Source header" in json.loads(combined.content)["detail"]
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0


def test_an_integer_event_id_is_its_digits():
    response = deliver("/hooks/stripe", {**EVENT, "id": 4711})
    assert response.status_code == 201 and IdempotencyRecord.objects.get().key == "4711"


def test_an_extractor_that_raises_lookup_error_is_a_400_not_a_500():
    response = deliver("/hooks/dotted", EVENT)
    assert response.status_code == 400 and slug(response) == "invalid-key"
    assert "KeyError" in json.loads(response.content)["detail"]


def test_an_optional_extracted_key_that_is_absent_runs_unprotected():
    response = deliver("/hooks/optional", EVENT)
    assert response.status_code == 201 and IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("wrong-secret", "the X-Test-Signature digest does not match the body"),
        ("", "the X-Test-Signature header is missing"),
    ],
)
def test_an_unsigned_or_badly_signed_delivery_is_refused_before_the_claim(secret, reason):
    """403 ``invalid-signature`` before anything is claimed, its detail saying what was
    wrong with the signature (never an authentication problem: senders do not log in)."""
    if secret:
        response = deliver("/hooks/stripe", EVENT, secret=secret)
    else:
        response = Client().post("/hooks/stripe", json.dumps(EVENT),
                                 content_type="application/json")  # fmt: skip
    assert response.status_code == 403 and slug(response) == "invalid-signature"
    assert response.json()["title"] == "Request signature refused"
    assert reason in response.json()["detail"]
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


def test_a_verifier_of_the_senders_own_is_refused_with_the_general_reason():
    """A bare ``callable(request) -> bool`` (a sender's SDK) gives no reason of its own:
    its refusal says the signature is missing or does not match; its acceptance runs."""
    body = json.dumps(EVENT)
    refused = Client().post("/hooks/sdk", body, content_type="application/json",
                            HTTP_X_SDK_SIGNATURE="forged")  # fmt: skip
    assert refused.status_code == 403 and slug(refused) == "invalid-signature"
    assert "it is missing or does not match the body" in refused.json()["detail"]
    accepted = Client().post("/hooks/sdk", body, content_type="application/json",
                             HTTP_X_SDK_SIGNATURE="valid")  # fmt: skip
    assert accepted.status_code == 201
    assert IdempotencyRecord.objects.get().principal == "webhook:sdk"


def test_a_forged_delivery_cannot_read_the_senders_stored_response():
    assert deliver("/hooks/stripe", EVENT).status_code == 201
    forged = deliver("/hooks/stripe", EVENT, secret="guess")
    assert forged.status_code == 403 and b"widget" not in forged.content
    assert slug(forged) == "invalid-signature"


def test_a_signature_over_another_body_is_refused():
    body = json.dumps(EVENT).encode()
    response = Client().post("/hooks/stripe", body.replace(b"1200", b"1300"),
                             content_type="application/json",
                             HTTP_X_TEST_SIGNATURE=sign(SECRET, body))  # fmt: skip
    assert response.status_code == 403 and slug(response) == "invalid-signature"
    assert "digest does not match the body" in response.json()["detail"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_redelivery_while_the_first_runs_gets_409(gate):
    """Two deliveries of one event at once: one runs, the other gets 409 in flight."""
    name, the_gate = gate
    event = {"id": "evt_slow", "data": {"amount": 1}}
    body = json.dumps(event).encode()
    results: dict[str, int] = {}

    def first() -> None:
        try:
            results["first"] = Client().post(
                "/hooks/slow", body, content_type="application/json",
                HTTP_X_TEST_SIGNATURE=sign(SECRET, body), HTTP_X_GATE=name,
            ).status_code  # fmt: skip
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert the_gate.entered.wait(10)
        duplicate = Client().post("/hooks/slow", body, content_type="application/json",
                                  HTTP_X_TEST_SIGNATURE=sign(SECRET, body))  # fmt: skip
        assert duplicate.status_code == 409 and slug(duplicate) == "request-in-flight"
    finally:
        the_gate.opened.set()
        thread.join(10)
    assert results["first"] == 201 and Widget.objects.count() == 1


BODY = json.dumps(EVENT).encode()
DIGEST = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()


def signed_with(value: str, path: str = "/hooks/stripe") -> Any:
    """``BODY`` delivered with ``value`` as its signature header, exactly."""
    client = Client(raise_request_exception=False)
    return client.post(path, BODY, content_type="application/json",
                       HTTP_X_TEST_SIGNATURE=value)  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("sha256=" + DIGEST[:-1] + "é", id="non-ascii"),
        pytest.param("sha256=" + "é" * 64, id="all-non-ascii"),
        pytest.param("sha256=" + DIGEST + "\u2028", id="non-ascii-space-after"),
        pytest.param("sha256=" + DIGEST[:-1], id="odd-length"),
        pytest.param("sha256=" + DIGEST[:-2], id="short"),
        pytest.param("sha256=" + DIGEST + "00", id="long"),
        pytest.param("sha256=" + DIGEST[:32] + " " + DIGEST[32:], id="inner-space"),
        pytest.param("sha256= " + DIGEST, id="space-after-prefix"),
        pytest.param("sha256=" + DIGEST[:-1] + "g", id="not-hex"),
        pytest.param("sha256=0x" + DIGEST[2:], id="0x"),
        pytest.param("sha512=" + DIGEST, id="another-algorithms-prefix"),
        pytest.param("SHA256=" + DIGEST, id="prefix-in-another-case"),
        pytest.param("sha1=" + hmac.new(SECRET.encode(), BODY, "sha1").hexdigest(), id="sha1"),
        pytest.param(DIGEST, id="no-prefix"),
        pytest.param("sha256=", id="prefix-only"),
        pytest.param("", id="empty"),
    ],
)
def test_a_malformed_signature_is_refused_never_an_error(value: str):
    """Every signature header that is not exactly ``sha256=<64 hex digits>`` is a 403
    ``invalid-signature`` saying it is malformed and what is expected, before anything
    is claimed: never a 500, whatever characters it holds, and never quoted back."""
    response = signed_with(value)
    assert response.status_code == 403 and slug(response) == "invalid-signature"
    detail = response.json()["detail"]
    assert "the X-Test-Signature header is malformed (expected 'sha256=' and 64 " in detail
    assert DIGEST[:16] not in detail and "é" not in detail  # the header is never quoted
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("sha256=" + DIGEST.upper(), id="upper-case-hex"),
        pytest.param(" sha256=" + DIGEST + "\t", id="surrounding-white-space"),
    ],
)
def test_a_signature_in_upper_case_hex_or_with_surrounding_space_is_accepted(value: str):
    """Hexadecimal digits of either case, and white space around the field value (not
    part of it, RFC 9110 §5.5), verify like the canonical form."""
    response = signed_with(value)
    assert response.status_code == 201 and Widget.objects.count() == 1


def test_a_rotated_secret_read_from_a_setting_applies_at_once(settings: Any):
    """A callable secret is read on every request: the old one stops verifying."""
    settings.WEBHOOK_SECRET = "whsec-rotated"
    old = signed_with(sign(SECRET, BODY), "/hooks/rotated")
    new = signed_with(sign("whsec-rotated", BODY), "/hooks/rotated")
    assert (old.status_code, new.status_code) == (403, 201)


@pytest.mark.parametrize("empty", ["", b"", None], ids=["str", "bytes", "none"])
def test_a_secret_setting_left_empty_refuses_every_delivery_and_says_so(
    settings: Any, caplog: pytest.LogCaptureFixture, empty: Any
):
    """A callable secret that returns nothing (a setting left empty in one
    environment) refuses every delivery, including one signed with the empty key, and
    logs an error naming the header each time."""
    settings.WEBHOOK_SECRET = empty
    empty_key = "sha256=" + hmac.new(b"", BODY, hashlib.sha256).hexdigest()
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        response = signed_with(empty_key, "/hooks/rotated")
    assert response.status_code == 403 and slug(response) == "invalid-signature"
    assert "the receiver could not check it" in response.json()["detail"]
    assert Widget.objects.count() == 0
    assert any(
        "X-Test-Signature" in r.getMessage() and "no secret" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("secret", ["", b""], ids=["str", "bytes"])
def test_an_empty_secret_is_refused_where_the_receiver_is_defined(secret: Any):
    """An empty secret given as a value is a mistake in the code: ``hmac_signature``
    and ``sign`` refuse it at once (the URLconf does not import), before any request."""
    with pytest.raises(ValueError, match="secret is empty"):
        hmac_signature(secret, "X-Hub-Signature-256")
    with pytest.raises(ValueError, match="secret is empty"):
        sign(secret, BODY)


def test_a_secret_of_another_type_or_an_unknown_digest_is_refused_at_once():
    """Only ``str``, ``bytes`` or a callable are secrets; ``digest`` must name a hash."""
    with pytest.raises(TypeError, match="not int"):
        hmac_signature(12345, "X-Hub-Signature-256")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a hashlib algorithm"):
        hmac_signature(SECRET, "X-Hub-Signature-256", digest="no-such-hash")


def test_another_digest_verifies_its_own_signatures():
    """``digest=`` and ``prefix=`` choose the algorithm and the header's form."""
    verify = hmac_signature(SECRET, "X-Sig", prefix="sha512=", digest="sha512")
    good = sign(SECRET, BODY, prefix="sha512=", digest="sha512")
    factory = RequestFactory()
    request = factory.post("/", BODY, content_type="application/json", HTTP_X_SIG=good)
    assert verify(request)
    wrong = factory.post("/", BODY, content_type="application/json",
                         HTTP_X_SIG="sha512=" + DIGEST)  # fmt: skip
    assert not verify(wrong)  # a sha256 digest under the sha512 prefix
