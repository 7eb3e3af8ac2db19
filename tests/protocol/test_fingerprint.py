from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from django.contrib.auth import authenticate, login
from django.contrib.auth.decorators import login_required
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import engines
from django.test import Client, RequestFactory, override_settings
from django.test.client import encode_multipart
from django.urls import path
from django.views.decorators.http import require_POST

from django_idempotency import idempotent
from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.digests import LENGTH
from django_idempotency.protocol.fingerprint import canonical_json, compute
from django_idempotency.store.fingerprints import same_request
from tests.support.factories import UserFactory
from tests.support.testapp.models import Widget

rf = RequestFactory()


def fp_json(body, path="/w", **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return compute(rf.post(path, data=data, content_type="application/json"), **kw)


def test_json_key_order_and_whitespace_do_not_matter():
    a = fp_json(b'{"cpu": 16, "labels": {"b": 1, "a": 2}}')
    b = fp_json(b'{\n  "labels":{"a":2,"b":1},"cpu":16}')
    assert a == b


def test_empty_object_differs_from_absent_field_and_null():
    assert fp_json({"labels": {}}) != fp_json({})
    assert fp_json({"labels": {}}) != fp_json({"labels": None})
    assert fp_json({"labels": []}) != fp_json({"labels": {}})


def test_values_and_types_matter():
    assert fp_json({"cpu": 16}) != fp_json({"cpu": 128})
    assert fp_json({"cpu": 16}) != fp_json({"cpu": "16"})
    assert fp_json({"cpu": 1}) != fp_json({"cpu": True})


def test_method_path_and_query_matter():
    base = rf.post("/w/1/reboot", data=b"{}", content_type="application/json")
    other_path = rf.post("/w/2/reboot", data=b"{}", content_type="application/json")
    put = rf.put("/w/1/reboot", data=b"{}", content_type="application/json")
    assert compute(base) != compute(other_path)
    assert compute(base) != compute(put)
    q1 = rf.post("/w?b=2&a=1", data=b"{}", content_type="application/json")
    q2 = rf.post("/w?a=1&b=2", data=b"{}", content_type="application/json")
    q3 = rf.post("/w?a=1&b=3", data=b"{}", content_type="application/json")
    assert compute(q1) == compute(q2) != compute(q3)


def test_exclusions_remove_top_level_and_nested_fields():
    one = {"cpu": 1, "client_ts": 1, "meta": {"sent_at": "x", "k": 1}, "items": [{"nonce": 1}]}
    two = {"cpu": 1, "client_ts": 2, "meta": {"sent_at": "y", "k": 1}, "items": [{"nonce": 2}]}
    exclude = ["client_ts", "meta.sent_at", "items.*.nonce"]
    assert fp_json(one) != fp_json(two)
    assert same_request(fp_json(one, exclude=exclude), fp_json(two, exclude=exclude))
    three = {**two, "cpu": 2}
    assert not same_request(fp_json(one, exclude=exclude), fp_json(three, exclude=exclude))


def test_invalid_json_is_hashed_as_raw_bytes():
    assert fp_json(b"{not json") != fp_json(b"{not  json")
    assert fp_json(b"{not json") == compute(
        rf.post("/w", data=b"{not json", content_type="application/json; charset=utf-8")
    )
    assert fp_json(b'{"a": 1}') != compute(
        rf.post("/w", data=b'{"a": 1}', content_type="application/octet-stream")
    )


def test_non_utf8_body_does_not_raise():
    assert len(fp_json(b'{"a": "\xff"}')) == LENGTH


def test_lone_surrogate_in_json_does_not_raise():
    assert len(fp_json(b'{"a": "\\ud800"}')) == LENGTH


def test_multipart_boundary_does_not_matter():
    def request(boundary: str, content: bytes = b"firmware-bytes"):
        upload = SimpleUploadedFile("fw.bin", content, content_type="application/octet-stream")
        body = encode_multipart(boundary, {"name": "n1", "image": upload})
        return rf.generic(
            "POST", "/flash", data=body, content_type=f"multipart/form-data; boundary={boundary}"
        )

    assert compute(request("BoUnDaRy1")) == compute(request("other-boundary-2"))
    assert compute(request("BoUnDaRy1")) != compute(request("BoUnDaRy1", b"other-bytes"))


@pytest.mark.parametrize("fields", [{"name": "n1"}, {}], ids=["fields", "no fields"])
def test_a_multipart_form_read_before_the_claim_is_fingerprinted_from_its_fields(fields):
    """A multipart POST something already parsed (a middleware reading ``request.POST``)
    has no body left to read: it is fingerprinted from its fields and uploads as if
    unread, an empty form too.

    Relies on Django's ``HttpRequest._read_started`` (see the contributor docs'
    architecture page).
    """

    def request(content: bytes = b"firmware-bytes"):
        upload = SimpleUploadedFile("fw.bin", content, content_type="application/octet-stream")
        body = encode_multipart("BoUnDaRy1", {**fields, "image": upload} if fields else {})
        return rf.generic(
            "POST", "/flash", data=body, content_type="multipart/form-data; boundary=BoUnDaRy1"
        )

    read, other = request(), request(b"other-bytes")
    assert dict(read.POST) == dict(other.POST)  # the stream is consumed, no body kept
    assert compute(read) == compute(request())
    if fields:
        assert compute(read) != compute(other)


def test_form_fields_matter_and_raw_bodies_hash_bytes():
    a = rf.post("/f", data={"a": "1"})
    b = rf.post("/f", data={"a": "2"})
    assert compute(a) != compute(b)
    raw1 = rf.post("/r", data=b"\x00\x01", content_type="application/octet-stream")
    raw2 = rf.post("/r", data=b"\x00\x02", content_type="application/octet-stream")
    assert compute(raw1) != compute(raw2)


def test_headers_only_when_configured():
    a = rf.post("/w", data=b"{}", content_type="application/json", HTTP_X_TENANT="t1")
    b = rf.post("/w", data=b"{}", content_type="application/json", HTTP_X_TENANT="t2")
    assert compute(a) == compute(b)
    assert compute(a, headers=["X-Tenant"]) != compute(b, headers=["x-tenant"])


def test_canonical_json_is_sorted_compact_and_keeps_unicode():
    assert canonical_json({"b": 1, "a": ["é", {"d": None, "c": 1.5}]}) == (
        '{"a":["é",{"c":1.5,"d":null}],"b":1}'.encode()
    )


def test_fingerprint_is_stable_across_releases():
    # Pinned: changing the scheme would make every stored record mismatch (422).
    assert fp_json({"cpu": 16}) == fp_json(b'{"cpu":16}')
    assert fp_json({"cpu": 16}) == (
        "fp3:w3OCnjVPuoAclvfaM9SZGRypL3RDADp6ojDu1LNot60EBBo5BAQaObXwjMI"
        ".g5Qk1xIm3clZPF5ffTANVv62-kJwigsS.56eOJTO01g94JF3-HpEYKBZ-dBRrFpyj.IQBPuBWp"
    )


def test_form_bodies_of_every_method_are_fingerprinted():
    for method in ("put", "patch", "delete"):
        a = getattr(rf, method)("/w", data="name=alpha", content_type=URLENCODED)
        b = getattr(rf, method)("/w", data="name=bravo", content_type=URLENCODED)
        assert compute(a) != compute(b), method
        c = getattr(rf, method)("/w", data="name=alpha", content_type=URLENCODED)
        assert compute(a) == compute(c)


def test_multipart_put_is_fingerprinted_and_boundary_free():
    def put(boundary: str, content: bytes):
        upload = SimpleUploadedFile("fw.bin", content, content_type="application/octet-stream")
        body = encode_multipart(boundary, {"name": "n1", "image": upload})
        return rf.generic(
            "PUT", "/flash", data=body, content_type=f"multipart/form-data; boundary={boundary}"
        )

    assert compute(put("b1", b"one")) == compute(put("other-b2", b"one"))
    assert compute(put("b1", b"one")) != compute(put("b1", b"two"))


def test_the_order_of_repeated_fields_matters_but_names_commute():
    def form(body: str):
        return compute(rf.post("/w", data=body, content_type=URLENCODED))

    assert form("image=ubuntu&image=debian") != form("image=debian&image=ubuntu")
    assert form("a=1&b=2") == form("b=2&a=1")
    q = lambda qs: compute(rf.post(f"/w?{qs}", data=b"", content_type="text/plain"))  # noqa: E731
    assert q("sort=name&sort=-created") != q("sort=-created&sort=name")
    assert q("a=1&b=2") == q("b=2&a=1")


def test_the_view_can_still_read_the_body_of_a_form_post():
    upload = SimpleUploadedFile("fw.bin", b"bytes", content_type="application/octet-stream")
    body = encode_multipart("bnd", {"name": "n1", "image": upload})
    request = rf.generic("POST", "/f", data=body, content_type="multipart/form-data; boundary=bnd")
    compute(request)
    assert request.body == body
    assert request.POST["name"] == "n1" and request.FILES["image"].read() == b"bytes"


def test_exclusions_never_modify_the_parsed_data():
    data = {"a": 1, "client_ts": 2, "meta": {"sent_at": 3}}
    canonical_json(data, ["client_ts", "meta.sent_at"])
    assert data == {"a": 1, "client_ts": 2, "meta": {"sent_at": 3}}


URLENCODED = "application/x-www-form-urlencoded"


# --- the media type -------------------------------------------------------------------


def typed(content_type: str, body: bytes = b'{"a": 1}', path: str = "/w") -> str:
    """The fingerprint of a POST of ``body`` declared as ``content_type`` (also when
    ``body`` is empty: Django's RequestFactory leaves the type out then)."""
    request = rf.generic(
        "POST", path, data=body, content_type=content_type, CONTENT_TYPE=content_type
    )
    assert request.content_type == content_type.split(";")[0].strip().lower()
    return compute(request)


def test_the_same_bytes_under_another_media_type_are_another_request():
    """A JSON body sent as ``application/json`` and as ``application/vnd.x+json``, or
    raw bytes as ``text/plain`` and ``application/xml``: two requests."""
    assert typed("application/json") != typed("application/vnd.example+json")
    assert typed("application/merge-patch+json") != typed("application/vnd.example+json")
    assert typed("text/plain", b"<a/>") != typed("application/xml", b"<a/>")
    assert typed("text/plain", b"<a/>") != typed("", b"<a/>")  # no Content-Type at all


def test_parameters_and_case_of_the_media_type_do_not_count():
    """``charset`` only says how the text is encoded (the JSON is decoded with it); the
    type and subtype are case-insensitive (RFC 9110 §8.3.1)."""
    plain = typed("application/json")
    assert typed("application/json; charset=utf-8") == plain
    assert typed("Application/JSON;charset=UTF-8") == plain
    assert typed("application/json; charset=latin-1") == plain  # ASCII text: same JSON
    vendor = typed("application/vnd.example+json")
    assert typed("application/VND.Example+JSON; version=2") == vendor


def test_urlencoded_and_multipart_forms_of_the_same_fields_differ():
    """A parser may take one form encoding and refuse the other (DRF's FormParser)."""
    urlencoded = rf.post("/f", data="name=a", content_type=URLENCODED)
    multipart = rf.post("/f", data={"name": "a"})  # the test client's default: multipart
    assert compute(urlencoded) != compute(multipart)


def test_an_empty_body_has_no_media_type():
    """An empty body is the same request whatever ``Content-Type`` it declares (DRF
    parses no empty body; clients differ in sending a type without a body)."""
    none = typed("", b"", "/w/1/cancel")
    for content_type in ("application/json", "text/plain", URLENCODED, "multipart/form-data"):
        assert typed(content_type, b"", "/w/1/cancel") == none, content_type


def test_fingerprints_of_the_implied_media_types_are_pinned():
    """Pinned: a JSON body as ``application/json``, a urlencoded form, an empty body and
    a raw body without ``Content-Type``, in the stored format: the method, path, query
    and headers parts are the same in all of them, so only the body's tag (the last of
    the packed bytes of the first segment), the whole digest and the raw digests differ."""
    assert typed("application/json", b'{"cpu":16}') == (
        "fp3:w3OCnjVPuoAclvfaM9SZGRypL3RDADp6ojDu1LNot60EBBo5BAQaObXwjMI"
        ".g5Qk1xIm3clZPF5ffTANVv62-kJwigsS.56eOJTO01g94JF3-HpEYKBZ-dBRrFpyj.IQBPuBWp"
    )
    assert compute(rf.post("/w", data="a=1", content_type=URLENCODED)) == (
        "fp3:9yrI_ZTdNTnmlfhKJuPhvX1K6uiyxztjojDu1LNot60EBBo5BAQaOZgOLLc"
        ".M1h6FM2JrY50SPplnNPnX_s7zN5Uqu4k.OszbRjC0SdTt9yqJLTs51ZVBTWBhGQpC.IQBPuBWp"
    )
    empty = (
        "fp3:nBhZEYdqCjgCyqC5WV8rUx9_yD0_8FVZojDu1LNot60EBBo5BAQaOZ0B8NA"
        ".1ylX5NqrYk3hJ67GD1mAagNuIsdxT_M9.uUvzSaoOUcDBJoSXNe6VYppx-3cjE2tS.IQBPuBWp"
    )
    assert typed("", b"") == typed("application/json", b"") == empty
    assert typed("", b"raw") == (
        "fp3:13ZipwsB-fC26dQ5esGr9go5igNiXFuLojDu1LNot60EBBo5BAQaORC-_44"
        ".5B4e6lFBLjfz71WKusvekjLm6hNQcQSW.hGxOV6STTLRSKtbkzX34Dod1TviOvW4R.IQBPuBWp"
    )


@pytest.mark.django_db
def test_a_key_replays_only_to_the_media_type_it_was_first_used_with(api: Any, key: str):
    """A key first used with ``application/json`` is not replayed to the same bytes
    sent as ``application/vnd.example+json``, which the view refuses (415) under a new
    key: a 422 ``key-reused``, as for another body. ``charset`` changes nothing."""
    body = json.dumps({"name": "typed", "size": 16})

    def send(content_type: str, with_key: str = key) -> Any:
        return api.post("/widgets", body, content_type=content_type,
                        HTTP_IDEMPOTENCY_KEY=with_key)  # fmt: skip

    assert send("application/json").status_code == 201
    assert send("application/vnd.example+json", str(uuid.uuid4())).status_code == 415
    other = send("application/vnd.example+json")
    assert other.status_code == 422 and other.json()["type"].endswith("key-reused")
    again = send("Application/JSON; charset=utf-8")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.filter(name="typed").count() == 1


# --- per-render form tokens -------------------------------------------------------------

FORM = engines["django"].from_string(
    '<form method="post">{% csrf_token %}<input name="item"></form>'
)


def form_page(request: HttpRequest) -> HttpResponse:
    """The form as a browser gets it: Django renders a freshly masked CSRF token."""
    return HttpResponse(FORM.render({}, request))


@require_POST
def log_in(request: HttpRequest) -> HttpResponse:
    """Django's login: it rotates the CSRF token (``rotate_token``)."""
    user = authenticate(request, username=request.POST["username"], password="pw")
    assert user is not None
    login(request, user)
    return HttpResponse(status=204)


@require_POST
@login_required
@idempotent
def form_create(request: HttpRequest) -> JsonResponse:
    """docs/usage.md's plain view, CSRF-protected: a browser's form."""
    widget = Widget.objects.create(name=request.POST["item"])
    return JsonResponse({"id": widget.pk}, status=201)


urlpatterns = [
    path("form", form_page),
    path("log-in", log_in),
    path("form-create", form_create),
]

CSRF_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


def rendered_token(client: Client) -> str:
    page = client.get("/form").content.decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None
    return found[1]


def log_in_as(client: Client, username: str) -> None:
    response = client.post(
        "/log-in", {"username": username, "csrfmiddlewaretoken": rendered_token(client)}
    )
    assert response.status_code == 204


def browser() -> tuple[Client, str]:
    """A browser's session (CSRF enforced, logged in through Django's ``login``) and
    its user's name."""
    user = UserFactory(username=f"form-{uuid.uuid4().hex[:8]}")
    user.set_password("pw")
    user.save()
    client = Client(enforce_csrf_checks=True)
    log_in_as(client, user.username)
    return client, user.username


def submit(client: Client, key: str, item: str = "from the form", **form: str) -> Any:
    data = {"item": item, "csrfmiddlewaretoken": rendered_token(client), **form}
    return client.post("/form-create", data, HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@override_settings(MIDDLEWARE=CSRF_MIDDLEWARE)
@pytest.mark.parametrize("encoding", ["multipart", "urlencoded"])
def test_a_form_retried_with_a_re_rendered_csrf_token_is_replayed(encoding: str):
    """A session-authenticated form POST retried from a re-rendered page (Django masks
    the CSRF token afresh on every render) is the same request: replayed, the view ran
    once. Another item is still a 422."""
    client, key = browser()[0], str(uuid.uuid4())

    def send(item: str = "from the form") -> Any:
        token = rendered_token(client)
        if encoding == "multipart":
            data: Any = {"item": item, "csrfmiddlewaretoken": token}
            return client.post("/form-create", data, HTTP_IDEMPOTENCY_KEY=key)
        body = f"item={item.replace(' ', '+')}&csrfmiddlewaretoken={token}"
        return client.post("/form-create", body, content_type=URLENCODED,
                           HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip

    first = send()
    assert first.status_code == 201, first.content
    again = send()  # a fresh render: another masked token
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    other = send("another item")
    assert other.status_code == 422 and other.json()["type"].endswith("key-reused")
    assert Widget.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@override_settings(MIDDLEWARE=CSRF_MIDDLEWARE)
def test_a_form_retried_after_a_new_login_is_replayed():
    """A new login rotates the CSRF secret, so the retry's token is unrelated to the
    first one: still the same request."""
    (client, username), key = browser(), str(uuid.uuid4())
    secret = client.cookies["csrftoken"].value
    assert submit(client, key).status_code == 201
    log_in_as(client, username)
    assert client.cookies["csrftoken"].value != secret  # rotated
    again = submit(client, key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1 and IdempotencyRecord.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@override_settings(MIDDLEWARE=CSRF_MIDDLEWARE, IDEMPOTENCY={"FINGERPRINT_FORM_TOKENS": ["nonce"]})
def test_the_form_tokens_setting_names_the_fields_left_out():
    """``FINGERPRINT_FORM_TOKENS`` replaces the default: here the CSRF token counts
    again (a re-rendered one is another request) and a field ``nonce`` does not."""
    client, key = browser()[0], str(uuid.uuid4())
    token = rendered_token(client)

    def send(nonce: str, csrf: str = token) -> Any:
        data = {"item": "x", "nonce": nonce, "csrfmiddlewaretoken": csrf}
        return client.post("/form-create", data, HTTP_IDEMPOTENCY_KEY=key)

    assert send("1").status_code == 201
    assert send("2")["Idempotent-Replayed"] == "true"  # the nonce does not count
    retried = send("1", rendered_token(client))  # the re-rendered CSRF token does
    assert retried.status_code == 422 and retried.json()["type"].endswith("key-reused")


def test_form_tokens_leave_json_bodies_alone():
    """Django reads the CSRF token from form fields only: a JSON field of that name is
    the application's data and counts."""
    a = rf.post("/w", data={"item": "x", "csrfmiddlewaretoken": "one"})
    b = rf.post("/w", data={"item": "x", "csrfmiddlewaretoken": "two"})
    tokens = ["csrfmiddlewaretoken"]
    assert compute(a) != compute(b)
    assert same_request(compute(a, form_exclude=tokens), compute(b, form_exclude=tokens))
    ja = fp_json({"item": "x", "csrfmiddlewaretoken": "one"}, form_exclude=tokens)
    jb = fp_json({"item": "x", "csrfmiddlewaretoken": "two"}, form_exclude=tokens)
    assert not same_request(ja, jb)


@pytest.mark.django_db
def test_a_bodiless_retry_is_replayed_whatever_content_type_it_declares(key: str):
    """A POST without a body declared as a form (``curl -d ''``) and its retry sent
    without ``Content-Type`` are one request: the retry is replayed."""
    client = Client()
    client.force_login(UserFactory(username="bodiless"))
    first = client.post("/plain", b"", content_type=URLENCODED, CONTENT_TYPE=URLENCODED,
                        HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    assert first.status_code == 201, first.content
    again = client.generic("POST", "/plain", b"", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
