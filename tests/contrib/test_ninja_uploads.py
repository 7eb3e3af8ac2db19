"""Protected Ninja PUT and PATCH operations with file uploads (docs/ninja.md).

Ninja's ``fix_request_files_middleware`` parses their multipart bodies (Django parses
those of POST only) and consumes the stream on the way: the fingerprint is taken from
what it parsed, the same for a retry and different for another file.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.client import encode_multipart

from django_idempotency.models import IdempotencyRecord
from tests.support.testapp.models import Widget

FIX = "ninja.compatibility.files.fix_request_files_middleware"
BOUNDARY = "idempotency-test-boundary"

pytestmark = [pytest.mark.urls("tests.support.ninja_uploads"), pytest.mark.django_db]


@pytest.fixture(autouse=True)
def files_middleware(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, FIX]


def send(method: str, token: Any, key: str, content: bytes, name: str = "front") -> Any:
    body = encode_multipart(
        BOUNDARY, {"name": name, "picture": SimpleUploadedFile("p.png", content)}
    )
    return Client().generic(
        method,
        "/ninja/widgets/7/picture",
        body,
        content_type=f"multipart/form-data; boundary={BOUNDARY}",
        HTTP_AUTHORIZATION=f"Bearer {token.key}",
        HTTP_IDEMPOTENCY_KEY=key,
    )


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_an_upload_runs_once_replays_and_another_file_with_the_key_is_422(
    method: str, alice: Any
) -> None:
    key = str(uuid.uuid4())
    first = send(method, alice, key, b"\x89PNG one")
    assert first.status_code == 200, first.content
    assert not first.has_header("Idempotent-Replayed")
    replay = send(method, alice, key, b"\x89PNG one")
    assert replay.status_code == 200, replay.content
    assert replay.content == first.content
    assert replay["Idempotent-Replayed"] == "true"
    other = send(method, alice, key, b"\x89PNG two")
    assert other.status_code == 422, other.content
    assert other.json()["type"].endswith("key-reused")
    renamed = send(method, alice, key, b"\x89PNG one", name="back")
    assert renamed.status_code == 422
    assert Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.endpoint == f"{method} /ninja/widgets/{{widget_id}}/picture"
