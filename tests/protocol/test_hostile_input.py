"""Hostile input: whatever a client sends, we never answer 500 and never lose a request.

The properties, checked with hypothesis over the header, the body and the content type
(docs/robustness.md):

* a client mistake gets a problem+json answer (RFC 9457) whose ``type`` ends with a
  slug from ``django_idempotency.problems``, never a 500;
* a request we reject did nothing: no business row, no record;
* a request we accept ran exactly once: one business row, one completed record, and
  the same request again is a byte-exact replay.

Each example scopes its records to a principal of its own (the ``X-Tenant`` resolver
of ``tests.support.robustness_app``), so examples never see each other's keys.
"""

from __future__ import annotations

import http.client
import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings
from django.test.testcases import LiveServerThread
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.protocol import problems
from tests.support.clients import client_for
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.urls("tests.support.robustness_app")

TENANT = override_settings(
    IDEMPOTENCY={"PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal"}
)
PROBLEM = "application/problem+json"
SLUGS = {p.slug for p in problems.ALL}
PROPERTY = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
printable = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def assert_problem(response: Any, status: int | None = None, slug: str | None = None) -> dict:
    """A problem+json answer of ours: documented slug, title, detail, no trace."""
    assert response["Content-Type"] == PROBLEM, (response.status_code, response.content[:200])
    body = json.loads(response.content)
    assert body["type"].rsplit("#", 1)[-1] in SLUGS
    assert body["title"] and body["detail"] and body["status"] == response.status_code
    assert "Traceback" not in response.content.decode()
    if status is not None:
        assert response.status_code == status, response.content
    if slug is not None:
        assert body["type"].endswith("#" + slug), body
    return body


def tenant_client() -> tuple[Client, str]:
    """An anonymous client scoped to a principal of its own (``X-Tenant``)."""
    tenant = f"tenant-{uuid.uuid4()}"
    return Client(raise_request_exception=False, HTTP_X_TENANT=tenant), tenant


def effects(tenant: str) -> tuple[int, list[str]]:
    """(business rows of this example, states of its records)."""
    rows = Widget.objects.filter(name=f"raw:{tenant}"[:100]).count()
    states = list(
        IdempotencyRecord.objects.filter(principal=tenant).values_list("state", flat=True)
    )
    return rows, states


def assert_did_nothing(tenant: str) -> None:
    assert effects(tenant) == (0, [])


def assert_ran_once(tenant: str) -> None:
    assert effects(tenant) == (1, [RecordState.COMPLETED])


def send_raw(
    client: Client,
    tag: str,
    *,
    key: str | None,
    body: bytes = b"",
    ct: str = "",
    method: str = "POST",
) -> Any:
    extra = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.generic(method, f"/r/raw?tag={tag}", body, content_type=ct, **extra)


# --- The Idempotency-Key header -----------------------------------------------------


def bare_key_is_valid(value: str) -> bool:
    """Independent oracle for the bare (Stripe style) spelling."""
    key = value.strip(" \t")
    return (
        0 < len(key) <= 255
        and not key.startswith('"')
        and "," not in key
        and all(0x20 <= ord(c) <= 0x7E for c in key)
    )


header_values = st.one_of(
    st.text(),  # any Unicode, control characters included
    st.binary().map(lambda b: b.decode("latin-1")),  # what a WSGI server hands over
    st.text(printable, min_size=1, max_size=300),
    st.text(printable, min_size=250, max_size=2000),
    st.text().map(lambda t: f'"{t}"'),
    st.text(printable, max_size=300).map(
        lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'
    ),
    st.lists(st.text(printable, min_size=1, max_size=40), min_size=2, max_size=3).map(", ".join),
    st.sampled_from(["", " ", "\t", '""', '"', "\x00", "a\nb", "\r\n", "?1", "1", "(a)", "*a"]),
)


@pytest.mark.django_db
@TENANT
@PROPERTY
@given(value=header_values)
def test_any_header_value_is_accepted_once_or_refused_cleanly(value: str) -> None:
    client, tenant = tenant_client()
    tag = uuid.uuid4().hex
    first = send_raw(client, tag, key=value)
    event(f"status {first.status_code}")
    assert first.status_code in (201, 400), first.content
    if first.status_code == 400:
        assert_problem(first, 400, "invalid-key")
        assert_did_nothing(tenant)
        return
    assert_ran_once(tenant)
    key = IdempotencyRecord.objects.get(principal=tenant).key
    assert 1 <= len(key) <= 255 and all(0x20 <= ord(c) <= 0x7E for c in key)
    again = send_raw(client, tag, key=value)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert_ran_once(tenant)
    stripped = value.strip(" \t")
    if not stripped.startswith('"'):
        assert bare_key_is_valid(value) and key == stripped


@pytest.mark.django_db
@TENANT
@PROPERTY
@given(
    value=st.text(printable, min_size=1, max_size=300)
    .map(str.strip)
    .filter(lambda v: v and not v.startswith('"'))  # a quoted value is the other spelling
)
def test_bare_key_oracle_matches_exactly(value: str) -> None:
    """Every bare value (printable ASCII) is accepted exactly when the oracle says so.

    A value opening with ``"`` is a Structured Field String, not a bare key: ``"0"``
    is the key ``0`` (tests/protocol/test_keys.py covers that spelling).
    """
    client, _tenant = tenant_client()
    tag = uuid.uuid4().hex
    response = send_raw(client, tag, key=value)
    assert response.status_code == (201 if bare_key_is_valid(value) else 400), value


@pytest.mark.django_db
@TENANT
@pytest.mark.parametrize("length", [256, 10_000, 200_000])
def test_oversized_keys_are_400(length: int) -> None:
    client, tenant = tenant_client()
    response = send_raw(client, "long", key="k" * length)
    body = assert_problem(response, 400, "invalid-key")
    assert str(length) in body["detail"] and "k" * 50 not in body["detail"]
    assert_did_nothing(tenant)


# --- Bodies and content types -------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
content_types = st.one_of(
    st.sampled_from(
        [
            "",
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=latin-1",
            "application/json; charset=utf-16",
            "application/json; charset=no-such-codec",
            "application/merge-patch+json",
            "text/plain",
            "application/octet-stream",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/form-data; boundary=xyz",
            "multipart/form-data; boundary=" + "b" * 80,
            "multipart/mixed; boundary=xyz",
            "APPLICATION/JSON",
            ";;;",
            "application/json; charset",
        ]
    ),
    st.text(printable, max_size=60),
)
bodies = st.one_of(
    st.binary(max_size=512),
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode("latin-1", "replace")),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 60).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from(
        [
            b"",
            b"{",
            b'{"a": NaN}',
            b'{"a": 1e400}',
            b'{"a": ' + b"9" * 5000 + b"}",
            b"\xff\xfe{\x00}\x00",
            b"\xef\xbb\xbf{}",
            b'--xyz\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--xyz--\r\n',
            b"--xyz\r\nbroken",
            b"a=1&a=2&%zz=%ff&b",
        ]
    ),
)


@pytest.mark.django_db
@TENANT
@PROPERTY
@given(body=bodies, ct=content_types)
def test_any_body_and_content_type_on_a_plain_view(body: bytes, ct: str) -> None:
    client, tenant = tenant_client()
    tag = uuid.uuid4().hex
    key = str(uuid.uuid4())
    first = send_raw(client, tag, key=key, body=body, ct=ct)
    event(f"status {first.status_code}")
    assert first.status_code != 500
    if first.status_code != 201:
        assert_problem(first, 400, "unreadable-body")
        assert_did_nothing(tenant)
        return
    assert_ran_once(tenant)
    again = send_raw(client, tag, key=key, body=body, ct=ct)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert_ran_once(tenant)


@pytest.mark.django_db
@PROPERTY
@given(body=bodies, ct=content_types)
def test_any_body_and_content_type_on_a_drf_view(body: bytes, ct: str) -> None:
    token = TokenFactory(user__username=f"u{uuid.uuid4().hex}")
    api = client_for(token)
    api.raise_request_exception = False
    key = str(uuid.uuid4())
    first = api.generic("POST", "/r/echo", body, content_type=ct, HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code < 500, first.content[:300]
    event(f"status {first.status_code}")
    rows = Widget.objects.filter(name=f"echo:{token.user.username}").count()
    records = list(IdempotencyRecord.objects.filter(key=key).values_list("state", flat=True))
    if first.status_code != 201:
        # our problem, or DRF's parse error / 415 raised in the view: released
        if first["Content-Type"] == PROBLEM:
            assert_problem(first)
        assert (rows, records) == (0, [])
        return
    assert (rows, records) == (1, [RecordState.COMPLETED])
    again = api.generic("POST", "/r/echo", body, content_type=ct, HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


@pytest.mark.django_db
@PROPERTY
@given(value=st.dictionaries(st.text(max_size=8), json_values, max_size=6), data=st.data())
def test_json_reformatted_is_a_replay_and_changed_is_422(value: dict, data: st.DataObject) -> None:
    token = TokenFactory(user__username=f"u{uuid.uuid4().hex}")
    api = client_for(token)
    key = str(uuid.uuid4())

    def send(body: str) -> Any:
        return api.generic(
            "POST", "/r/echo", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
        )

    first = send(json.dumps(value))
    assert first.status_code == 201
    reordered = dict(reversed(list(value.items())))
    again = send(json.dumps(reordered, indent=data.draw(st.sampled_from([None, 1, 4]))))
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    changed = {**value, "extra-field": data.draw(json_values)}
    assert_problem(send(json.dumps(changed)), 422, "key-reused")
    assert Widget.objects.filter(name=f"echo:{token.user.username}").count() == 1


@pytest.mark.django_db
@TENANT
@pytest.mark.parametrize("url", ["/r/raw", "/r/echo"])
@pytest.mark.parametrize("depth", [100_000, 1_000_000])
def test_deeply_nested_json_is_400_not_500(alice: Any, url: str, depth: int) -> None:
    """Deep enough for every supported Python's ``json`` (3.13 parses 5,000 levels)."""
    client, _ = tenant_client()
    if url == "/r/echo":
        client = client_for(alice)
    body = b"[" * depth + b"]" * depth
    response = client.post(
        url, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k", HTTP_X_TENANT="t"
    )
    body_json = assert_problem(response, 400, "unreadable-body")
    assert "nested too deeply" in body_json["detail"]
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@pytest.mark.django_db
def test_same_bytes_in_another_charset_is_another_request(api: Any, key: str) -> None:
    """DRF decodes JSON with the declared charset; so must the fingerprint, or a retry
    whose bytes mean something else would be answered with the first one's replay."""
    body = '{"name": "caf\u00e9"}'.encode()
    first = api.post(
        "/widgets",
        body,
        content_type="application/json; charset=latin-1",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert first.status_code == 201 and json.loads(first.content)["name"] == "caf\u00c3\u00a9"
    second = api.post(
        "/widgets", body, content_type="application/json; charset=utf-8", HTTP_IDEMPOTENCY_KEY=key
    )
    assert_problem(second, 422, "key-reused")
    # the same text in the declared charset is the same request: a replay
    same_text = '{"name": "caf\u00c3\u00a9"}'.encode()
    third = api.post(
        "/widgets", same_text, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert third["Idempotent-Replayed"] == "true" and third.content == first.content
    assert Widget.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "a", "size": 1e400}',
        b'{"name": "a", "size": ' + b"9" * 5000 + b"}",
        b'{"name": "a", "size": NaN}',
        b'{"name": "\xff\xfe"}',
        b"\xef\xbb\xbf{}",
    ],
)
def test_numbers_and_bytes_json_cannot_hold_are_4xx_and_released(api: Any, body: bytes) -> None:
    api.raise_request_exception = False
    key = str(uuid.uuid4())
    response = api.post("/widgets", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400  # DRF's parse or validation error, raised: released
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


# --- Oversized and malformed bodies -------------------------------------------------


@pytest.mark.django_db
@TENANT
@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
@pytest.mark.parametrize(
    ("ct", "body"),
    [
        ("application/json", json.dumps({"a": "x" * 2000}).encode()),
        ("text/plain", b"x" * 2000),
        ("application/x-www-form-urlencoded", b"a=" + b"x" * 2000),
        (
            "multipart/form-data; boundary=BB",
            b'--BB\r\nContent-Disposition: form-data; name="a"\r\n\r\n'
            + b"x" * 2000
            + b"\r\n--BB--\r\n",
        ),
    ],
)
def test_body_over_data_upload_max_memory_size_is_413(ct: str, body: bytes) -> None:
    client, tenant = tenant_client()
    with override_settings(
        IDEMPOTENCY={"PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal"}
    ):
        response = send_raw(client, "big", key="k1", body=body, ct=ct)
        assert_problem(response, 413, "body-too-large")
        assert_did_nothing(tenant)
        # nothing was recorded: the same key with a body that fits runs
        small = send_raw(client, "big", key="k1", body=b"ok", ct="text/plain")
        assert small.status_code == 201 and "Idempotent-Replayed" not in small


@pytest.mark.django_db
@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_body_over_the_limit_on_drf_views_is_413(api: Any, key: str) -> None:
    for url in ("/widgets", "/vs/widgets/", "/r/echo"):
        response = api.post(url, {"name": "x" * 2000}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert_problem(response, 413, "body-too-large")
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@pytest.mark.django_db
@TENANT
@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=10)
def test_too_many_form_fields_is_400() -> None:
    client, tenant = tenant_client()
    body = "&".join(f"f{i}=1" for i in range(50)).encode()
    response = send_raw(client, "many", key="k", body=body, ct="application/x-www-form-urlencoded")
    assert_problem(response, 400, "unreadable-body")
    assert_did_nothing(tenant)


@pytest.mark.django_db
@TENANT
@pytest.mark.parametrize(
    "ct",
    ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=\x00"],
)
def test_multipart_without_a_usable_boundary_is_400(ct: str) -> None:
    client, tenant = tenant_client()
    response = send_raw(client, "mp", key="k", body=b"--xyz\r\nbroken", ct=ct)
    assert_problem(response, 400, "unreadable-body")
    assert_did_nothing(tenant)


@pytest.mark.django_db
@TENANT
def test_multipart_retry_with_a_new_boundary_is_a_replay() -> None:
    client, tenant = tenant_client()

    def part(boundary: str) -> bytes:
        return (
            f'--{boundary}\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="f"; filename="x.bin"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n\xff\x00\r\n--{boundary}--\r\n"
        ).encode("latin-1")

    first = send_raw(
        client, "mp2", key="k", body=part("one"), ct="multipart/form-data; boundary=one"
    )
    again = send_raw(
        client, "mp2", key="k", body=part("two"), ct="multipart/form-data; boundary=two"
    )
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert_ran_once(tenant)


# --- Methods ------------------------------------------------------------------------


@pytest.mark.django_db
@TENANT
@pytest.mark.parametrize("method", ["PATCH", "PUT", "DELETE", "PROPFIND", "X-ANY_TOKEN", "post"])
def test_any_unsafe_method_is_recorded_under_its_own_endpoint(method: str) -> None:
    client, tenant = tenant_client()
    first = send_raw(client, method, key="k", method=method)
    assert first.status_code == 201
    again = send_raw(client, method, key="k", method=method)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    record = IdempotencyRecord.objects.get(principal=tenant)
    assert record.endpoint == f"{method.upper()} /r/raw"
    assert send_raw(client, method, key=None, method=method).status_code == 400  # key required


@pytest.mark.django_db
@TENANT
@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "TRACE"])
def test_safe_methods_are_never_recorded_even_with_a_bad_key(method: str) -> None:
    client, tenant = tenant_client()
    response = send_raw(client, method, key="\x00bad, key", method=method)
    assert response.status_code == 201  # the view ran, unprotected, as without the app
    assert IdempotencyRecord.objects.filter(principal=tenant).count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["PROPFIND", "FOO", "GET"])
def test_methods_a_drf_view_does_not_allow_are_405_and_record_nothing(
    api: Any, method: str
) -> None:
    response = api.generic(
        method, "/r/echo", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert response.status_code == 405
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0


# --- Over real HTTP: duplicate header lines, raw bytes, odd methods -----------------


@pytest.fixture
def http_server(transactional_db: Any) -> Iterator[tuple[str, int]]:
    """A real HTTP server (Django's test server, WSGI) in a thread: (host, port).

    Django's own ``LiveServerThread`` without the static-files handler (the test
    settings have no ``STATIC_URL``); it serves this module's ``urls`` marker.
    """
    thread = LiveServerThread("127.0.0.1", lambda handler: handler, port=0)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait(30)
    if thread.error:
        raise thread.error
    yield "127.0.0.1", thread.port
    thread.terminate()


def http_request(http_server: Any, lines: list[bytes], body: bytes = b"") -> tuple[int, bytes]:
    """Send one request with exactly these header lines over a socket; (status, body)."""
    head = b"\r\n".join([*lines, b"Content-Length: %d" % len(body), b"Connection: close"])
    with socket.create_connection(http_server, timeout=30) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw_response = b"".join(chunks)
    status = int(raw_response.split(b" ", 2)[1])
    return status, raw_response.split(b"\r\n\r\n", 1)[1]


@pytest.fixture
def live_token(transactional_db: Any) -> str:
    return TokenFactory(user__username="live").key


def live_lines(token: str, method: bytes = b"POST", path: bytes = b"/r/echo") -> list[bytes]:
    return [
        method + b" " + path + b" HTTP/1.1",
        b"Host: testserver",
        b"Authorization: Token " + token.encode(),
        b"Content-Type: application/json",
    ]


@pytest.mark.parametrize(
    "values",
    [
        [b"a", b"b"],
        [b"same", b"same"],
        [b'"a"', b'"b"'],
        [b'"same"', b'"same"'],
        [b'"a"', b"b"],
        [b"a", b""],
        [b"", b"a"],
    ],
)
def test_duplicate_key_header_lines_over_http_are_400(http_server, live_token, values) -> None:
    lines = live_lines(live_token) + [b"Idempotency-Key: " + v for v in values]
    status, body = http_request(http_server, lines, b"{}")
    assert status == 400, body
    problem = json.loads(body)
    assert problem["type"].endswith("#invalid-key")
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0


def test_http_client_putheader_twice_is_400(http_server, live_token) -> None:
    conn = http.client.HTTPConnection(*http_server, timeout=30)
    conn.putrequest("POST", "/r/echo")
    conn.putheader("Authorization", f"Token {live_token}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Idempotency-Key", "first")
    conn.putheader("Idempotency-Key", "second")
    conn.putheader("Content-Length", "2")
    conn.endheaders(b"{}")
    response = conn.getresponse()
    assert response.status == 400
    assert response.getheader("Content-Type") == PROBLEM
    conn.close()
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (b"\xff\xfe", "the byte 0xFF, which is not UTF-8"),
        (b"caf\xc3\xa9", "the character 'é' (UTF-8 bytes C3 A9)"),
        (b'"caf\xc3\xa9"', "the character 'é' (UTF-8 bytes C3 A9)"),
        (b"k\xe2\x82\xac", "the character '€' (UTF-8 bytes E2 82 AC)"),
        (b"a\x00b", "the control character '\\x00'"),
        (b"\x7f", "the control character '\\x7f'"),
        (b"a\tb", "the control character '\\t'"),
    ],
)
def test_non_ascii_key_bytes_over_http_are_400_naming_what_was_sent(
    http_server, live_token, value, named
) -> None:
    """The detail names the offending character as the client wrote it (its UTF-8
    bytes read back from the ISO-8859-1 the server decoded them as), never mojibake."""
    status, body = http_request(
        http_server, [*live_lines(live_token), b"Idempotency-Key: " + value]
    )
    assert status == 400, body
    problem = json.loads(body)
    assert problem["type"].endswith("#invalid-key")
    assert named in problem["detail"], problem["detail"]
    assert IdempotencyRecord.objects.count() == 0 and Widget.objects.count() == 0


def test_one_key_header_over_http_runs_once_then_replays(http_server, live_token) -> None:
    lines = [*live_lines(live_token), b'Idempotency-Key: "k-live"']
    first = http_request(http_server, lines, b'{"tag": 1}')
    again = http_request(http_server, [*lines[:-1], b"Idempotency-Key: k-live"], b'{ "tag" : 1 }')
    assert first[0] == again[0] == 201 and first[1] == again[1]
    assert Widget.objects.count() == 1


@pytest.mark.parametrize("method", [b"post", b"PROPFIND", b"PATCH"])
def test_odd_methods_over_http(http_server, live_token, method) -> None:
    from tests.support.factories import UserFactory

    UserFactory(username="live")
    lines = [
        method + b" /r/raw?tag=m HTTP/1.1",
        b"Host: testserver",
        b"X-Tenant: t-live",
        b"Idempotency-Key: k",
    ]
    with override_settings(
        IDEMPOTENCY={"PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal"}
    ):
        first = http_request(http_server, lines, b"x")
        again = http_request(http_server, lines, b"x")
    assert first[0] == again[0] == 201 and first[1] == again[1]
    record = IdempotencyRecord.objects.get()
    assert record.endpoint == f"{method.decode().upper()} /r/raw"
    assert Widget.objects.count() == 1


# --- Responses too large to store ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("stream", ["", "1"])
def test_response_over_max_response_bytes_is_sent_once_and_never_run_again(stream: str) -> None:
    client, tenant = tenant_client()
    url = f"/r/sized?n=5000&stream={stream}"
    settings_ = {
        "PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal",
        "MAX_RESPONSE_BYTES": 4096,
    }
    with override_settings(IDEMPOTENCY=settings_):
        first = client.post(url, HTTP_IDEMPOTENCY_KEY="k")
        content = b"".join(first.streaming_content) if first.streaming else first.content
        assert first.status_code in (200, 201) and len(content) == 5000  # the client got it all
        record = IdempotencyRecord.objects.get(principal=tenant)
        assert record.state == RecordState.COMPLETED and record.response_body is None
        again = client.post(url, HTTP_IDEMPOTENCY_KEY="k")
    body = assert_problem(again, 410, "response-too-large-to-replay")
    assert body["original_status"] == first.status_code
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"] and again["ETag"] == first["ETag"]
    assert Widget.objects.filter(name="sized").count() == 1  # never run twice
    with override_settings(IDEMPOTENCY={**settings_, "MAX_RESPONSE_BYTES": None}):
        # raising the limit later does not make the dropped body come back
        assert client.post(url, HTTP_IDEMPOTENCY_KEY="k").status_code == 410


@pytest.mark.django_db
@TENANT
def test_response_at_the_limit_is_replayed() -> None:
    client, _ = tenant_client()
    with override_settings(
        IDEMPOTENCY={
            "PRINCIPAL_RESOLVER": "tests.support.robustness_app.tenant_principal",
            "MAX_RESPONSE_BYTES": 4096,
        }
    ):
        first = client.post("/r/sized?n=4096", HTTP_IDEMPOTENCY_KEY="k")
        again = client.post("/r/sized?n=4096", HTTP_IDEMPOTENCY_KEY="k")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert len(again.content) == 4096


@pytest.mark.django_db
def test_default_max_response_bytes_is_one_mebibyte() -> None:
    from django_idempotency.conf import DEFAULTS, conf

    assert DEFAULTS["MAX_RESPONSE_BYTES"] == conf.max_response_bytes == 1024 * 1024


# --- Bodies DRF reads before we do --------------------------------------------------


@pytest.mark.django_db
@TENANT
def test_query_escapes_are_fingerprinted_byte_for_byte() -> None:
    """Django decodes the query string with the body's declared charset: ``%E9`` and
    ``%E8`` are two different letters in latin-1, so they are two requests."""
    client, tenant = tenant_client()
    ct = "text/plain; charset=latin-1"
    first = client.post("/r/raw?tag=%E9", b"x", content_type=ct, HTTP_IDEMPOTENCY_KEY="k")
    assert json.loads(first.content)["tag"] == "\u00e9"
    assert_problem(
        client.post("/r/raw?tag=%E8", b"x", content_type=ct, HTTP_IDEMPOTENCY_KEY="k"),
        422,
        "key-reused",
    )
    # the same bytes, escaped or not, are the same request
    again = client.post("/r/raw?tag=%e9", b"x", content_type=ct, HTTP_IDEMPOTENCY_KEY="k")
    assert again["Idempotent-Replayed"] == "true"
    assert_ran_once(tenant)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fmt", "first", "reformatted", "changed"),
    [
        ("json", {"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, {"a": 1, "b": [2, 1]}),
        ("multipart", {"a": "1", "b": "2"}, {"b": "2", "a": "1"}, {"a": "1", "b": "3"}),
    ],
)
def test_body_parsed_by_a_permission_before_the_claim(api, key, fmt, first, reformatted, changed):
    """DRF consumed the stream in ``initial()``; the fingerprint uses what it parsed."""
    one = api.post("/r/peek", first, format=fmt, HTTP_IDEMPOTENCY_KEY=key)
    assert one.status_code == 201, one.content
    two = api.post("/r/peek", reformatted, format=fmt, HTTP_IDEMPOTENCY_KEY=key)
    assert two["Idempotent-Replayed"] == "true" and two.content == one.content
    assert_problem(api.post("/r/peek", changed, format=fmt, HTTP_IDEMPOTENCY_KEY=key), 422)
    assert Widget.objects.filter(name="peek").count() == 1


@pytest.mark.django_db
def test_non_json_body_consumed_by_a_custom_parser_is_fingerprinted_from_the_parse(api, key):
    """DRF keeps no bytes of a body it parsed before the claim (a permission reading
    request.data, or DRF's CSRF check under session auth): the parser's result is
    fingerprinted instead, so the request runs once, replays, and a change is a 422."""
    first = api.post("/r/peek", b"hello", content_type="text/plain", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    again = api.post("/r/peek", b"hello", content_type="text/plain", HTTP_IDEMPOTENCY_KEY=key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    other = api.post("/r/peek", b"bye", content_type="text/plain", HTTP_IDEMPOTENCY_KEY=key)
    assert_problem(other, 422, "key-reused")
    assert Widget.objects.count() == 1


@pytest.mark.django_db
def test_exclusions_do_not_remove_fields_from_request_data_parsed_before_the_claim(api, key):
    """The permission parses the body first; FINGERPRINT_EXCLUDE must not touch it."""
    from django.test import override_settings

    with override_settings(IDEMPOTENCY={"FINGERPRINT_EXCLUDE": ["client_ts"]}):
        response = api.post(
            "/r/peek", {"a": 1, "client_ts": 5}, format="json", HTTP_IDEMPOTENCY_KEY=key
        )
    assert response.status_code == 201, response.content
    assert response.json()["data"] == {"a": 1, "client_ts": 5}
