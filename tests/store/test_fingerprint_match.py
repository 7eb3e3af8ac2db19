"""When a record's fingerprint and a request's are one request, in Python and in SQL.

The claim compares them in Python (replay, 422, a takeover after the lease) and, on
PostgreSQL, in SQL (a presence takeover, in the plain table's statement and in the
partitioned table's function): both must give the same answer for every pair.
"""

from __future__ import annotations

from django.test import RequestFactory

from django_idempotency.protocol.fingerprint import compute
from django_idempotency.store.fingerprints import same_request

rf = RequestFactory()


def fp(body: bytes, *, exclude: tuple[str, ...] = (), headers: tuple[str, ...] = (),
       price_list: str = "2025", path: str = "/w") -> str:  # fmt: skip
    request = rf.post(path, data=body, content_type="application/json",
                      HTTP_X_PRICE_LIST=price_list)  # fmt: skip
    return compute(request, exclude=exclude, headers=headers)


SENT = b'{"a": 1, "sent_at": 1}'
LATER = b'{"a": 1, "sent_at": 2}'
OTHER = b'{"a": 2, "sent_at": 1}'
HEADERS = ("X-Price-List",)


def test_the_same_request_under_any_settings_matches() -> None:
    stored = fp(SENT)
    assert same_request(stored, fp(SENT, exclude=("sent_at",)))
    assert same_request(stored, fp(SENT, headers=HEADERS))
    assert same_request(fp(SENT, exclude=("sent_at",), headers=HEADERS), fp(SENT))


def test_what_the_settings_leave_out_matches_only_under_those_settings() -> None:
    assert same_request(fp(SENT, exclude=("sent_at",)), fp(LATER, exclude=("sent_at",)))
    assert not same_request(fp(SENT), fp(LATER, exclude=("sent_at",)))
    assert not same_request(fp(SENT), fp(LATER))


def test_another_body_or_path_never_matches() -> None:
    assert not same_request(fp(SENT), fp(OTHER, exclude=("sent_at",)))
    assert not same_request(fp(SENT), fp(OTHER, headers=HEADERS))
    assert not same_request(fp(SENT), fp(SENT, path="/w/2", headers=HEADERS))


def test_under_the_same_header_names_the_header_values_count() -> None:
    stored = fp(SENT, headers=HEADERS)
    assert not same_request(stored, fp(SENT, headers=HEADERS, price_list="2026"))
    assert not same_request(stored, fp(SENT, headers=HEADERS, exclude=("sent_at",),
                                       price_list="2026"))  # fmt: skip
    # Under other header names the record holds no digest of the new ones: the body decides.
    assert same_request(fp(SENT), fp(SENT, headers=HEADERS, price_list="2026"))


def test_a_value_of_another_kind_matches_only_itself() -> None:
    payload = "0" * 64  # inbox's payload fingerprint
    assert same_request(payload, payload)
    assert not same_request(payload, "1" * 64)
    assert not same_request(payload, fp(SENT)) and not same_request(fp(SENT), payload)
