from __future__ import annotations

import json

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory
from django.test.client import encode_multipart

from django_idempotency.fingerprint import canonical_json, compute

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
    assert fp_json(one, exclude=exclude) == fp_json(two, exclude=exclude)
    three = {**two, "cpu": 2}
    assert fp_json(one, exclude=exclude) != fp_json(three, exclude=exclude)


def test_invalid_json_is_hashed_as_raw_bytes():
    assert fp_json(b"{not json") != fp_json(b"{not  json")
    # The same bytes sent as an opaque body: the same fingerprint, so the JSON body
    # that failed to parse was hashed byte for byte.
    raw = rf.post("/w", data=b"{not json", content_type="application/octet-stream")
    assert fp_json(b"{not json") == compute(raw)
    assert fp_json(b'{"a": 1}') != compute(
        rf.post("/w", data=b'{"a": 1}', content_type="application/octet-stream")
    )


def test_non_utf8_body_does_not_raise():
    assert len(fp_json(b'{"a": "\xff"}')) == 64


def test_lone_surrogate_in_json_does_not_raise():
    assert len(fp_json(b'{"a": "\\ud800"}')) == 64


def test_multipart_boundary_does_not_matter():
    def request(boundary: str, content: bytes = b"firmware-bytes"):
        upload = SimpleUploadedFile("fw.bin", content, content_type="application/octet-stream")
        body = encode_multipart(boundary, {"name": "n1", "image": upload})
        return rf.generic(
            "POST", "/flash", data=body, content_type=f"multipart/form-data; boundary={boundary}"
        )

    assert compute(request("BoUnDaRy1")) == compute(request("other-boundary-2"))
    assert compute(request("BoUnDaRy1")) != compute(request("BoUnDaRy1", b"other-bytes"))


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
        "56b3a4f865095a4e67c508f3759a393ddb6d0aa47624a97fe283bb23bb3d36fe"
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
