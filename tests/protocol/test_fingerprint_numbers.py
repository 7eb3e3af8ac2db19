"""JSON numbers in fingerprints: compared by exact decimal value, never via floats.

The rule (docs/protocol.md, "Fingerprint"): two numbers are the same when their
decimal values are equal, whatever their spelling (``1e2`` is ``100``, ``1.0`` is
``1``, ``-0`` is ``0``); different values never share a fingerprint, even beyond
double precision.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, RequestFactory
from django.test.client import encode_multipart
from django.urls import path
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    permission_classes,
)
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency import idempotent
from django_idempotency.protocol import exact_json
from django_idempotency.protocol.fingerprint import _body_parts, canonical_json, compute
from django_idempotency.store.fingerprints import same_request

rf = RequestFactory()


def fp(body: str | bytes, **kw: object) -> str:
    return compute(rf.post("/pay", data=body, content_type="application/json"), **kw)  # type: ignore[arg-type]


def parts(body: str) -> list[bytes]:
    return _body_parts(rf.post("/pay", data=body, content_type="application/json"), None, ())


def test_digits_beyond_double_precision_count():
    assert fp('{"amount": 100.10000000000000001}') != fp('{"amount": 100.1}')
    assert fp("[0.1]") != fp("[0.10000000000000001]")
    assert fp("[9007199254740993.0]") != fp("[9007199254740992]")  # 2**53 + 1 vs 2**53


@pytest.mark.parametrize(
    "spellings",
    [
        ["100", "1e2", "1E2", "1e+2", "100.0", "1.00E+2", "10000e-2"],
        ["1", "1.0", "1.000", "10e-1", "0.1e1"],
        ["0", "-0", "0.0", "-0.0", "0e5", "0E-999999999"],
        ["100.1", "100.10", "1.001e2", "1001e-1", "100.1000000000000000000000"],
        ["-2.5", "-2.50", "-25e-1"],
        ["1e999999999", "10e999999998", "1.0e999999999"],
        ["1" + "0" * 40, "1e40", "10e39"],
    ],
)
def test_numerically_equal_spellings_are_one_number(spellings):
    prints = {fp(f'{{"a": [{text}], "b": {{"c": {text}}}}}') for text in spellings}
    assert len(prints) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("1e999999999", "1e999999998"),
        ("1e-999999999", "0"),
        ("1e-999999999", "1e-999999998"),
        ("1e400", "1e401"),
        ("1", "1.5"),
        ("1", "true"),
        ("0", "false"),
        ("100", '"100"'),
        ("1" + "0" * 40, "1" + "0" * 41),
        ("123456789012345678901234567890.5", "123456789012345678901234567890.50000001"),
    ],
)
def test_different_values_never_match(a, b):
    assert fp(f'{{"a": {a}}}') != fp(f'{{"a": {b}}}')


def test_integers_beyond_python_digit_limit_are_numbers_too():
    digits = "7" * 5000
    assert fp(f"[{digits}]") == fp(f"[{digits[0]}.{digits[1:]}e4999]")
    assert fp(f"[{digits}]") != fp(f"[{digits}1]")


def test_a_run_of_zeros_in_a_string_changes_nothing():
    zeros = "0" * 40
    assert parts(f'{{"s": "{zeros}", "n": 1e40}}') == [
        b"json",
        f'{{"n":1e40,"s":"{zeros}"}}'.encode(),
    ]


def test_huge_exponents_are_never_expanded():
    body = "[" + ",".join(["1e999999999", "-1e-999999999", "1.5e400"] * 1000) + "]"
    canonical = parts(body)[1]
    assert canonical.startswith(b"[1e999999999,-1e-999999999,15e399,")
    assert len(canonical) < 2 * len(body)


@pytest.mark.parametrize("body", ['{"a": 01}', '{"a": 1.}', '{"a": .5}', '{"a": 1e}', '{"a": +1}'])
def test_malformed_numbers_are_hashed_raw_as_before(body):
    assert parts(body) == [b"raw", body.encode()]
    assert fp(body) != fp(body.replace('"a": ', '"a":'))


def test_nan_and_infinity_are_as_before():
    assert parts('{"a": NaN, "b": -Infinity}') == [b"json", b'{"a":NaN,"b":-Infinity}']


def test_a_very_long_exponent_is_hashed_raw():
    body = '{"a": 1e' + "9" * 5000 + "}"
    assert parts(body) == [b"raw", body.encode()]


def test_exclusions_still_apply():
    a = fp('{"amount": 1e2, "client_ts": 1.5}', exclude=["client_ts"])
    assert same_request(a, fp('{"amount": 100}', exclude=["client_ts"]))


def consumed(body: str) -> HttpRequest:
    request = rf.post("/pay", data=body, content_type="application/json")
    request.read()  # a parser (DRF's CSRF check) read the stream before the claim
    return request


@pytest.mark.parametrize("text", ["100.0", "1e2", "100.1", "-0.0", "1e300", "0.1"])
def test_parsed_floats_match_the_raw_body(text):
    body = f'{{"a": {text}}}'
    parsed = json.loads(body)  # what DRF's JSONParser gives: binary floats
    assert compute(consumed(body), parsed_body=parsed) == fp(body)


def test_parsed_decimals_are_exact():
    body = '{"a": 100.10000000000000001}'
    parsed = json.loads(body, parse_float=Decimal)
    assert compute(consumed(body), parsed_body=parsed) == fp(body)
    assert compute(consumed(body), parsed_body=parsed) != fp('{"a": 100.1}')


def test_parsed_floats_cannot_see_beyond_double_precision():
    """The documented limit: the parser's floats are all there is, for us and the view."""
    body = '{"a": 100.10000000000000001}'
    assert compute(consumed(body), parsed_body=json.loads(body)) == fp('{"a": 100.1}')


def test_canonical_json_counts_numbers_by_value():
    assert (
        canonical_json({"a": 100.0, "b": Decimal("1.50"), "c": -0.0}) == b'{"a":100,"b":1.5,"c":0}'
    )
    assert canonical_json({"a": Decimal("1E+999999999")}) == b'{"a":1e999999999}'


def test_form_bodies_are_unaffected():
    def form(value: str) -> str:
        body = encode_multipart("BoUnDaRy", {"amount": value})
        request = rf.post("/pay", data=body, content_type="multipart/form-data; boundary=BoUnDaRy")
        return compute(request)

    assert form("1e2") != form("100")
    urlencoded = [
        compute(
            rf.post("/pay", data=f"amount={v}", content_type="application/x-www-form-urlencoded")
        )
        for v in ("1e2", "100")
    ]
    assert urlencoded[0] != urlencoded[1]


def _spell(value: Decimal, zeros: int, scientific: bool) -> str:
    """One more spelling of ``value``: padded with zeros, or in exponent form."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    digits_text = ("".join(map(str, digits)) + "0" * zeros).lstrip("0") or "0"
    exponent -= zeros
    if scientific:
        return f"{'-' if sign else ''}{digits_text}e{exponent}"
    return str(Decimal(f"{'-' if sign else ''}{digits_text}e{exponent}"))


def _json_number(value: Decimal) -> str:
    text = str(value).replace("E", "e")
    return text if value.is_signed() or not text.startswith("+") else text[1:]


decimals = st.decimals(allow_nan=False, allow_infinity=False, min_value=None, max_value=None)


@given(decimals, st.integers(0, 5), st.booleans())
def test_property_spellings_of_one_value_are_equal(value, zeros, scientific):
    a = exact_json.dumps(exact_json.loads(_json_number(value)))
    b = exact_json.dumps(exact_json.loads(_spell(value, zeros, scientific)))
    assert a == b


@given(decimals)
def test_property_the_canonical_text_is_the_exact_value(value):
    canonical = exact_json.dumps(exact_json.loads(_json_number(value)))
    assert Decimal(canonical.decode()) == value  # so different values never collide


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_property_parsed_floats_match_their_text(value):
    text = json.dumps(value)
    assert canonical_json(value) == exact_json.dumps(exact_json.loads(text))


# Over HTTP: a view that parses amounts with Decimal never replays another request's
# response for a body that differs only beyond double precision.


def tenant(request: HttpRequest) -> str:
    return "tenant:numbers"


@idempotent(principal=tenant)
def pay(request: HttpRequest) -> HttpResponse:
    amount = json.loads(request.body, parse_float=Decimal)["amount"]
    return JsonResponse({"charged": str(amount)}, status=201)


class DecimalJSONParser(JSONParser):
    """A DRF parser that keeps every digit of the amounts."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return json.loads(stream.read().decode(), parse_float=Decimal)


class StreamJSONParser(BaseParser):
    """A parser DRF hands the request stream itself: the raw bytes are gone after it."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        return json.load(stream)


def _charge(request: Request) -> Response:
    return Response({"charged": str(request.data["amount"])}, status=201)


session_only = [authentication_classes([SessionAuthentication]), permission_classes([])]

drf_pay_decimal = idempotent(
    api_view(["POST"])(
        parser_classes([DecimalJSONParser])(session_only[0](session_only[1](_charge)))
    )
)
drf_pay_float = idempotent(api_view(["POST"])(session_only[0](session_only[1](_charge))))
drf_pay_stream = idempotent(
    api_view(["POST"])(
        parser_classes([StreamJSONParser])(session_only[0](session_only[1](_charge)))
    )
)

urlpatterns = [
    path("pay", pay),
    path("drf/decimal", drf_pay_decimal),
    path("drf/float", drf_pay_float),
    path("drf/stream", drf_pay_stream),
]


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_decimal_view_does_not_replay_a_different_amount():
    client = Client()
    key = str(uuid.uuid4())

    def send(body: str) -> HttpResponse:
        return client.post(
            "/pay", data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
        )

    first = send('{"amount": 100.1}')
    assert first.status_code == 201 and json.loads(first.content) == {"charged": "100.1"}
    other = send('{"amount": 100.10000000000000001}')
    assert other.status_code == 422, other.content
    assert other["Content-Type"] == "application/problem+json"
    same = send('{"amount": 1.001e2}')  # the same number, spelled differently
    assert same.status_code == 201 and same["Idempotent-Replayed"] == "true"
    assert same.content == first.content


def session_client() -> Client:
    """Session authentication with CSRF enforced: DRF parses the body before the claim."""
    from tests.support.factories import UserFactory

    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    client.cookies[settings.CSRF_COOKIE_NAME] = "a" * 32
    return client


def send_with(client: Client, url: str, key: str, body: str) -> HttpResponse:
    return client.post(
        url,
        data=body,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_CSRFTOKEN="a" * 32,
    )


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_body_parsed_before_the_claim_with_a_decimal_parser_is_exact():
    """DRF keeps the bytes its JSON parsers read (``request.body``): exact, raw path."""
    client, key = session_client(), str(uuid.uuid4())
    first = send_with(client, "/drf/decimal", key, '{"amount": 100.1}')
    assert first.status_code == 201, first.content
    other = send_with(client, "/drf/decimal", key, '{"amount": 100.10000000000000001}')
    assert other.status_code == 422, other.content
    same = send_with(client, "/drf/decimal", key, '{"amount": 100.10}')
    assert same.status_code == 201 and same["Idempotent-Replayed"] == "true"


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_body_parsed_before_the_claim_by_drf_json_parser_is_exact():
    client, key = session_client(), str(uuid.uuid4())
    first = send_with(client, "/drf/float", key, '{"amount": 100.1}')
    assert first.status_code == 201 and first.json() == {"charged": "100.1"}
    other = send_with(client, "/drf/float", key, '{"amount": 100.10000000000000001}')
    assert other.status_code == 422, other.content
    same = send_with(client, "/drf/float", key, '{"amount": 1001e-1}')
    assert same.status_code == 201 and same["Idempotent-Replayed"] == "true"


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_stream_consumed_before_the_claim_counts_what_the_view_sees():
    """The documented limit: a parser that consumed the stream left only its floats."""
    client, key = session_client(), str(uuid.uuid4())
    first = send_with(client, "/drf/stream", key, '{"amount": 100.1}')
    assert first.status_code == 201 and first.json() == {"charged": "100.1"}
    again = send_with(client, "/drf/stream", key, '{"amount": 100.10000000000000001}')
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content  # the view would have charged 100.1 again
    assert send_with(client, "/drf/stream", key, '{"amount": 100.0}').status_code == 422
    assert send_with(client, "/drf/stream", key, '{"amount": 1.001e2}').status_code == 201
