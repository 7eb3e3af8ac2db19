"""A Ninja API protected by ``contrib.ninja``, served by gunicorn, over real HTTP.

The server runs on the suite's test database (``tests.support.ninja_server``), so the
test creates the tokens and counts the rows. A duplicate of a request held in the
operation (on two FIFOs, ``tests.support.ninja_api.hold``) gets 409 with Retry-After.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.keys import HEADER
from tests.support.gunicorn import Gunicorn
from tests.support.testapp.models import Widget

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = "application/problem+json"

pytestmark = pytest.mark.django_db(transaction=True)


class NinjaServer(Gunicorn):
    """gunicorn (one worker, threaded) serving ``tests.support.ninja_wsgi``."""

    def __init__(self, folder: Path) -> None:
        super().__init__("tests.support.ninja_wsgi", cwd=ROOT, log=folder / "gunicorn.log")
        self.folder = folder

    def start(self) -> None:  # type: ignore[override]
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.support.ninja_server",
            NINJA_GATE_DIR=str(self.folder),
            PYTHONPATH=str(ROOT),
        )
        super().start(env)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NinjaServer]:
    os.mkfifo(tmp_path / "entered")
    os.mkfifo(tmp_path / "opened")
    running = NinjaServer(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def send(
    server: NinjaServer, path: str, token: Any, key: str | None, body: Any, **headers: str
) -> httpx.Response:
    sent = {"Authorization": f"Bearer {token.key}", **headers}
    if key is not None:
        sent[HEADER] = key
    try:
        return httpx.post(f"{server.url}/ninja/{path}", json=body, headers=sent, timeout=60)
    except httpx.TransportError as exc:
        pytest.fail(f"the server did not answer ({exc}):\n{server.log.read_text()}")


@pytest.mark.parametrize("path", ["widgets", "async-widgets"])
def test_keyed_requests_over_http(server: NinjaServer, alice: Any, bob: Any, path: str):
    key = str(uuid.uuid4())
    body = {"name": "http", "size": 4}
    first = send(server, path, alice, key, body)
    assert first.status_code == 201, server.log.read_text()
    replay = send(server, path, alice, key, body)
    assert replay.status_code == 201
    assert replay.content == first.content
    assert replay.headers["Content-Type"] == first.headers["Content-Type"]
    assert replay.headers["Idempotent-Replayed"] == "true"
    other_user = send(server, path, bob, key, body)  # another principal: its own key
    assert other_user.status_code == 201 and "Idempotent-Replayed" not in other_user.headers
    missing = send(server, path, alice, None, body)
    assert missing.status_code == 400 and missing.headers["Content-Type"] == PROBLEM
    reused = send(server, path, alice, key, {"name": "else"})
    assert reused.status_code == 422 and reused.headers["Content-Type"] == PROBLEM
    anonymous = httpx.post(
        f"{server.url}/ninja/{path}", json=body, headers={HEADER: str(uuid.uuid4())}
    )
    assert anonymous.status_code == 401  # Ninja's authentication, before any claim
    assert Widget.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 2


def test_a_concurrent_duplicate_over_http_gets_409_then_the_replay(server: NinjaServer, alice: Any):
    key = str(uuid.uuid4())
    body = {"name": "held"}
    results: dict[str, httpx.Response] = {}
    entered = threading.Event()

    def first() -> None:
        results["first"] = send(server, "widgets", alice, key, body, **{"X-Gate": "fifo"})

    def wait_for_entry() -> None:
        with (server.folder / "entered").open() as fifo:  # the operation writes on entry
            fifo.read()
        entered.set()

    watcher = threading.Thread(target=wait_for_entry, daemon=True)
    watcher.start()
    sender = threading.Thread(target=first)
    sender.start()
    try:
        assert entered.wait(60), f"the operation was never reached:\n{server.log.read_text()}"
        duplicate = send(server, "widgets", alice, key, body)
        assert duplicate.status_code == 409, duplicate.content
        assert duplicate.headers["Content-Type"] == PROBLEM
        assert duplicate.json()["type"].endswith("request-in-flight")
        assert int(duplicate.headers["Retry-After"]) >= 0
        assert Widget.objects.count() == 0  # the first is still held
    finally:
        if entered.is_set():
            with (server.folder / "opened").open("w"):  # lets the held operation go on
                pass
        sender.join(60)
    assert results["first"].status_code == 201, server.log.read_text()
    retry = send(server, "widgets", alice, key, body)
    assert retry.content == results["first"].content
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
