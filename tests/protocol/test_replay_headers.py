"""A replay is the response the first execution produced: every header but a denylist."""

from __future__ import annotations

import gzip
import json

import pytest
from django.test import override_settings
from django.utils import translation

from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.responses import HeaderPolicy, build, is_forbidden
from django_idempotency.store import StoredResponse
from tests.support.replay_app import DESCRIBING, PER_EXCHANGE
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.replay_app")]


def post(client, url, key, data=None, **extra):
    return client.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def test_every_describing_header_comes_back_without_configuration(api, key):
    first = post(api, "/x/export", key)
    assert first.status_code == 201
    again = post(api, "/x/export", key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    for name, value in DESCRIBING.items():
        assert again[name] == value, name
    assert again["ETag"] == first["ETag"] and again["Location"] == first["Location"]
    assert again["Content-Length"] == str(len(first.content))
    assert Widget.objects.count() == 1


def test_per_exchange_headers_are_never_stored_nor_replayed(api, key):
    first = post(api, "/x/export", key)
    for name, value in PER_EXCHANGE.items():
        assert first[name] == value  # the first response is untouched
    record = IdempotencyRecord.objects.get(key=key)
    stored = {name.lower() for name, _ in record.response_headers}
    assert not stored & {name.lower() for name in PER_EXCHANGE}
    assert not stored & {"set-cookie", "content-length", "idempotent-replayed"}
    again = post(api, "/x/export", key)
    for name in PER_EXCHANGE:
        assert name not in again, name
    assert "sessionid" not in again.cookies


def test_gzip_body_comes_back_labelled_as_gzip(api, key):
    first = post(api, "/x/gzip", key)
    again = post(api, "/x/gzip", key)
    assert again["Idempotent-Replayed"] == "true"
    assert again["Content-Encoding"] == "gzip"
    assert again["Content-Type"] == "application/json"
    assert "Accept-Encoding" in again["Vary"]
    assert gzip.decompress(again.content) == gzip.decompress(first.content)


def test_created_receipt_replays_the_apps_own_headers(api, key):
    first = post(api, "/x/receipt", key, {"name": "r"})
    again = post(api, "/x/receipt", key, {"name": "r"})
    assert again["Idempotent-Replayed"] == "true"
    for name in ("X-Resource-Version", "Location", "ETag", "Content-Type"):
        assert again[name] == first[name], name


@override_settings(IDEMPOTENCY={"REPLAY_DENY_HEADERS": ["X-Resource-Version", "X-Export-*"]})
def test_the_setting_extends_the_denylist_by_name_and_prefix(api, key):
    post(api, "/x/export", key)
    stored = {n.lower() for n, _ in IdempotencyRecord.objects.get(key=key).response_headers}
    assert "x-resource-version" not in stored and "x-export-rows" not in stored
    assert "content-disposition" in stored
    again = post(api, "/x/export", key)
    assert "X-Resource-Version" not in again and "X-Export-Rows" not in again


def test_a_header_denied_after_it_was_stored_is_not_replayed(api, key):
    post(api, "/x/export", key)
    with override_settings(IDEMPOTENCY={"REPLAY_DENY_HEADERS": ["x-resource-version"]}):
        again = post(api, "/x/export", key)
    assert again["Idempotent-Replayed"] == "true" and "X-Resource-Version" not in again


@override_settings(IDEMPOTENCY={"REPLAY_HEADERS": ["Server", "X-Export-Rows"]})
def test_replay_headers_still_work_and_keep_an_exchange_header(api, key):
    post(api, "/x/export", key)
    again = post(api, "/x/export", key)
    assert again["Server"] == "first-box/1.0"  # dropped by default, kept when named
    assert again["X-Export-Rows"] == "2"
    assert "Access-Control-Allow-Origin" not in again


def test_records_stored_under_the_old_allowlist_still_replay(api, key):
    first = post(api, "/x/export", key)
    old = [["Content-Type", "text/csv; charset=utf-8"], ["Location", first["Location"]]]
    IdempotencyRecord.objects.filter(key=key).update(response_headers=old)
    again = post(api, "/x/export", key)
    assert again.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert again["Content-Type"] == "text/csv; charset=utf-8"
    assert again["Location"] == first["Location"]
    assert again["Content-Length"] == str(len(first.content))
    assert "Content-Disposition" not in again  # never stored: nothing to replay


def test_forbidden_headers_in_an_old_record_are_never_replayed(api, key):
    post(api, "/x/export", key)
    record = IdempotencyRecord.objects.get(key=key)
    record.response_headers = [
        *record.response_headers,
        ["Set-Cookie", "leak=1"],
        ["WWW-Authenticate", 'Bearer realm="other"'],
        ["Content-Length", "999"],
    ]
    record.save(update_fields=["response_headers"])
    again = post(api, "/x/export", key)
    assert "Set-Cookie" not in again and "WWW-Authenticate" not in again
    assert again["Content-Length"] == str(len(again.content))


def test_build_sets_content_length_for_the_stored_bytes_and_none_on_204():
    stored = StoredResponse(201, [("Content-Type", "text/plain")], b"12345")
    assert build(stored, replayed=True)["Content-Length"] == "5"
    assert "Content-Length" not in build(StoredResponse(204, [], b""), replayed=True)


@pytest.mark.parametrize(
    "name",
    ["Set-Cookie", "WWW-Authenticate", "Date", "Connection", "Keep-Alive", "TE", "Trailer",
     "Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Whatever", "X-Request-Id",
     "traceparent", "tracestate", "X-Correlation-Id", "X-B3-TraceId", "Content-Length"],
)  # fmt: skip
def test_the_denylist_cannot_be_lifted(name):
    assert is_forbidden(name)
    assert not HeaderPolicy.current(keep=[name]).allows(name)


@pytest.mark.parametrize(
    "name",
    ["Content-Type", "Content-Encoding", "Content-Disposition", "Content-Language",
     "Cache-Control", "ETag", "Location", "Link", "Vary", "X-Resource-Version"],
)  # fmt: skip
def test_the_default_policy_keeps_what_describes_the_response(name):
    assert HeaderPolicy.current().allows(name)


def test_the_first_response_never_says_replayed(api, key):
    first = post(api, "/x/receipt", key, {"name": json.dumps("x")})
    assert "Idempotent-Replayed" not in first


@override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 5})
def test_the_410_for_a_body_too_large_keeps_pointers_not_body_headers(api, key):
    first = post(api, "/x/export", key)
    gone = post(api, "/x/export", key)
    assert gone.status_code == 410 and gone["Idempotent-Replayed"] == "true"
    assert gone["Content-Type"] == "application/problem+json"
    assert gone["Location"] == first["Location"] and gone["ETag"] == first["ETag"]
    assert gone["X-Resource-Version"] == "17"
    for name in ("Content-Disposition", "Content-Language", "X-Request-Id", "Date"):
        assert name not in gone, name
    assert json.loads(gone.content)["original_status"] == 201


@override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 5})
def test_the_410_never_says_gzip(api, key):
    post(api, "/x/gzip", key)
    gone = post(api, "/x/gzip", key)
    assert gone.status_code == 410 and "Content-Encoding" not in gone
    assert json.loads(gone.content)["status"] == 410  # a plain JSON problem body


@override_settings(IDEMPOTENCY={"REPLAY_DENY_HEADERS": "X-Resource-Version"})
def test_one_string_is_one_name(api, key):
    post(api, "/x/receipt", key, {"name": "r"})
    assert "X-Resource-Version" not in post(api, "/x/receipt", key, {"name": "r"})


LOCALE_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


def german() -> str:
    """The view's message as Django's German catalogue words it (it varies by release)."""
    with translation.override("de"):
        return translation.gettext("This field is required.")


@override_settings(MIDDLEWARE=LOCALE_MIDDLEWARE, LANGUAGES=[("de", "German"), ("en", "English")])
def test_a_replay_keeps_the_language_of_the_body_it_replays(api, key):
    """With Django's ``LocaleMiddleware``, a German first response replayed to a retry
    asking for English is still labelled ``Content-Language: de``: the label is stored
    with the body it describes, and the retry's middleware does not relabel it."""
    in_german = german()
    assert in_german != "This field is required."
    first = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="de")
    assert first.status_code == 201 and first.json()["message"] == in_german
    assert first["Content-Language"] == "de"
    again = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="en")
    assert again["Idempotent-Replayed"] == "true" and again.json()["message"] == in_german
    assert again["Content-Language"] == "de"
    assert "Accept-Language" in again["Vary"]  # the response still varies by language
    stored = dict(IdempotencyRecord.objects.get(key=key).response_headers)
    assert stored["Content-Language"] == "de"
    fresh = post(api, "/x/localised", "another-key", HTTP_ACCEPT_LANGUAGE="en")
    assert fresh["Content-Language"] == "en" and fresh.json()["message"] != in_german


@override_settings(LANGUAGES=[("de", "German"), ("en", "English")])
def test_without_locale_middleware_no_language_label_is_added(api, key):
    """Only ``LocaleMiddleware`` labels responses: without it neither the first
    response nor its replay carries ``Content-Language``."""
    first = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="de")
    again = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="de")
    assert again["Idempotent-Replayed"] == "true"
    assert "Content-Language" not in first and "Content-Language" not in again


@override_settings(
    MIDDLEWARE=["django.middleware.gzip.GZipMiddleware", *LOCALE_MIDDLEWARE],
    LANGUAGES=[("de", "German"), ("en", "English")],
)
def test_a_body_middleware_compresses_is_compressed_again_for_each_replay(api, key):
    """``GZipMiddleware`` compresses after the snapshot: the stored body is the one the
    view made, and each replay is compressed (and labelled) for its own retry, so the
    ``Content-Encoding`` a client sees always matches the bytes it gets."""
    first = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="de",
                 HTTP_ACCEPT_ENCODING="gzip")  # fmt: skip
    assert first["Content-Encoding"] == "gzip"
    body = json.loads(gzip.decompress(first.content))
    plain = post(api, "/x/localised", key, HTTP_ACCEPT_LANGUAGE="en")
    assert plain["Idempotent-Replayed"] == "true" and "Content-Encoding" not in plain
    assert plain.json() == body and plain["Content-Language"] == "de"
    packed = post(api, "/x/localised", key, HTTP_ACCEPT_ENCODING="gzip")
    assert packed["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(packed.content)) == body
    stored = dict(IdempotencyRecord.objects.get(key=key).response_headers)
    assert "Content-Encoding" not in stored
