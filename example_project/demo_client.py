"""The scripted client of ``demo.py``: real HTTP requests against a running leasebroker.

Each step prints what it sends and what comes back, then checks what
django-idempotency promises (docs/protocol.md). ``run_all`` returns the list of checks.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"
SHOWN_HEADERS = ("Location", "Idempotent-Replayed", "Retry-After")
BODY_WIDTH = 100
INDENT = " " * 11


@dataclass
class Check:
    """One expectation: its step, what was expected, and whether it held."""

    step: int
    name: str
    ok: bool
    detail: str = ""


def _short(text: str, width: int = BODY_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _wrapped(text: str, lines: int = 3) -> str:
    """``text`` on up to ``lines`` indented lines of ``BODY_WIDTH`` characters."""
    return textwrap.fill(
        text,
        BODY_WIDTH,
        initial_indent=INDENT,
        subsequent_indent=INDENT,
        max_lines=lines,
        break_on_hyphens=False,
        placeholder=" ...",
    )


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("Idempotent-Replayed") == "true"


class Demo:
    """The scripted client: alice and bob talking to ``base_url``.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"``.
        tokens: ``{"alice": key, "bob": key}``, DRF token keys.
        reboot_seconds: how long the server's fake reboot takes (for step 4's timing).
        out: where to print (``print`` by default).
    """

    def __init__(
        self,
        base_url: str,
        tokens: dict[str, str],
        *,
        reboot_seconds: float = 1.0,
        out: Callable[[str], None] = print,
    ) -> None:
        self.base_url = base_url
        self.tokens = tokens
        self.reboot_seconds = reboot_seconds
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.checks: list[Check] = []
        self.step = 0
        self.clients = {who: self._client(who) for who in tokens}

    # -- plumbing ------------------------------------------------------------------

    def _client(self, who: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Token {self.tokens[who]}"},
            timeout=30.0,
        )

    def close(self) -> None:
        """Close the HTTP connections."""
        for client in self.clients.values():
            client.close()

    def key(self, name: str) -> str:
        """A key unique to this run, so re-running the demo never replays old runs."""
        return f"demo-{self.run_id}-{name}"

    def heading(self, title: str) -> None:
        self.step += 1
        self.out("")
        self.out(f"== {self.step}. {title} ".ljust(78, "="))

    def show_request(
        self, who: str, method: str, path: str, key: str | None, body: Any = None
    ) -> None:
        self.out(f"  {who:<5} -> {method} {path}")
        if method != "GET":
            self.out(f"{INDENT}Idempotency-Key: {key if key is not None else '(none)'}")
        if body is not None:
            self.out(_wrapped(json.dumps(body)))

    def show_response(self, who: str, response: httpx.Response, note: str = "") -> None:
        headers = "  ".join(
            f"{name}: {response.headers[name]}"
            for name in SHOWN_HEADERS
            if name in response.headers
        )
        content_type = response.headers.get("Content-Type", "")
        if content_type.startswith(PROBLEM_JSON):
            headers = f"Content-Type: {PROBLEM_JSON}  {headers}".rstrip()
        line = f"  {who:<5} <- {response.status_code} {response.reason_phrase}"
        self.out("  ".join(part for part in (line, headers, note.strip()) if part))
        if response.content:
            data = _json(response)
            if isinstance(data, dict) and "title" in data and "detail" in data:
                self.out(_wrapped(f"{data['title']}. {data['detail']}"))
            else:
                self.out(_wrapped(response.text))

    def send(
        self,
        who: str,
        method: str,
        path: str,
        *,
        key: str | None = None,
        body: Any = None,
        quiet: bool = False,
    ) -> httpx.Response:
        """Send one request as ``who``; print it and its response unless ``quiet``."""
        headers = {"Idempotency-Key": key} if key is not None else {}
        if not quiet:
            self.show_request(who, method, path, key, body)
        response = self.clients[who].request(method, path, json=body, headers=headers)
        if not quiet:
            self.show_response(who, response)
        return response

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record an expectation; print ``[ok]`` or ``[FAIL]`` with what went wrong."""
        self.checks.append(Check(self.step, name, bool(ok), "" if ok else detail))
        mark = "[ok]  " if ok else "[FAIL]"
        self.out(f"  {mark} {name}" + ("" if ok else f"  ({detail})"))
        return bool(ok)

    def check_status(self, response: httpx.Response, status: int, what: str) -> bool:
        return self.check(
            f"{what}: {status}",
            response.status_code == status,
            f"got {response.status_code}: {_short(response.text, 100)}",
        )

    def count_run_workers(self, who: str) -> int:
        """How many of ``who``'s workers carry this run's label."""
        data = _json(self.send(who, "GET", "/v1/workers", quiet=True)) or []
        return sum(1 for w in data if (w.get("labels") or {}).get("demo-run") == self.run_id)

    # -- the story -----------------------------------------------------------------

    def run_all(self) -> list[Check]:
        """Run every step in order; stops early only if there is no worker to use."""
        worker_id = self.create_and_replay()
        self.key_reused()
        if worker_id is None:
            self.check("a worker exists for the remaining steps", False, "step 1 failed")
            return self.checks
        self.concurrent_reboot(worker_id)
        self.isolation(worker_id)
        self.missing_key()
        self.renew_lease(worker_id)
        self.delete(worker_id)
        return self.checks

    def worker_body(self, cpu: int = 2) -> dict[str, Any]:
        return {
            "image": "ubuntu-24.04",
            "cpu": cpu,
            "memory_gb": 4,
            "labels": {"team": "ci", "demo-run": self.run_id},
        }

    def create_and_replay(self) -> str | None:
        self.heading("alice provisions a worker (key K1)")
        k1 = self.key("K1")
        first = self.send("alice", "POST", "/v1/workers", key=k1, body=self.worker_body())
        self.check_status(first, 201, "first attempt creates it")
        worker_id = (_json(first) or {}).get("id")
        self.check(
            "Location points at the new worker",
            worker_id is not None and first.headers.get("Location") == f"/v1/workers/{worker_id}",
            f"Location: {first.headers.get('Location')}",
        )

        self.heading("the network drops the answer; alice retries with K1")
        again = self.send("alice", "POST", "/v1/workers", key=k1, body=self.worker_body())
        self.check_status(again, 201, "the retry answers like the first attempt")
        self.check(
            "it is a replay (Idempotent-Replayed: true)",
            _replayed(again),
            f"headers: {dict(again.headers)}",
        )
        self.check("same body, byte for byte", again.content == first.content, "bodies differ")
        count = self.count_run_workers("alice")
        self.out(f"  alice's workers from this run (GET /v1/workers): {count}")
        self.check("only one worker exists", count == 1, f"found {count}")
        return worker_id if isinstance(worker_id, str) else None

    def key_reused(self) -> None:
        self.heading("alice reuses K1 for a different request (cpu 4)")
        response = self.send(
            "alice", "POST", "/v1/workers", key=self.key("K1"), body=self.worker_body(4)
        )
        self.check_status(response, 422, "a key is bound to one request")
        self.check(
            "the error is problem+json (RFC 9457)",
            response.headers.get("Content-Type", "").startswith(PROBLEM_JSON),
            f"Content-Type: {response.headers.get('Content-Type')}",
        )

    def concurrent_reboot(self, worker_id: str) -> None:
        self.heading("two reboots with key K2 at the same time (a reboot takes a while)")
        path = f"/v1/workers/{worker_id}/reboot"
        k2 = self.key("K2")
        before = _json(self.send("alice", "GET", f"/v1/workers/{worker_id}", quiet=True)) or {}
        results: dict[str, tuple[httpx.Response | Exception, float]] = {}
        answered = threading.Event()
        started = time.monotonic()

        def fire(label: str) -> None:
            with self._client("alice") as client:
                try:
                    outcome: httpx.Response | Exception = client.post(
                        path, headers={"Idempotency-Key": k2}
                    )
                except httpx.HTTPError as exc:
                    outcome = exc
            results[label] = (outcome, time.monotonic() - started)
            answered.set()

        self.show_request("alice", "POST", path + "   (request A)", k2)
        thread_a = threading.Thread(target=fire, args=("A",))
        thread_a.start()
        # A head start so that A holds the key, far shorter than the reboot itself.
        answered.wait(timeout=max(0.1, self.reboot_seconds * 0.3))
        a_done_before_b = "A" in results
        self.show_request("alice", "POST", path + "   (request B, A still running)", k2)
        thread_b = threading.Thread(target=fire, args=("B",))
        thread_b.start()
        thread_a.join()
        thread_b.join()

        responses: dict[str, httpx.Response] = {}
        for label, (outcome, elapsed) in sorted(results.items(), key=lambda item: item[1][1]):
            if isinstance(outcome, Exception):
                self.out(f"  alice <- request {label} failed: {outcome!r}")
                continue
            responses[label] = outcome
            self.show_response("alice", outcome, f"   (request {label}, after {elapsed:.2f} s)")
        self.check(
            "B was sent while A was still running",
            not a_done_before_b,
            "A finished first: make the reboot slower, e.g. --reboot-seconds 2",
        )
        statuses = sorted(r.status_code for r in responses.values())
        self.check("one 200 and one 409", statuses == [200, 409], f"got {statuses}")
        winner = next((r for r in responses.values() if r.status_code == 200), None)
        loser = next((r for r in responses.values() if r.status_code == 409), None)
        if loser is not None:
            self.check(
                "the 409 says when to retry (Retry-After)",
                "Retry-After" in loser.headers,
                "no Retry-After header",
            )

        self.out("  ... A has finished; alice retries K2 as Retry-After told her:")
        retry = self.send("alice", "POST", path, key=k2)
        self.check_status(retry, 200, "the retry gets A's result")
        self.check(
            "it is a replay of A's response",
            _replayed(retry) and winner is not None and retry.content == winner.content,
            f"replayed={_replayed(retry)}",
        )
        after = _json(self.send("alice", "GET", f"/v1/workers/{worker_id}", quiet=True)) or {}
        old, new = before.get("reboots"), after.get("reboots")
        self.out(f"  reboots before: {old}, after: {new}")
        self.check(
            "the worker was rebooted exactly once",
            isinstance(old, int) and new == old + 1,
            f"reboots went from {old} to {new}",
        )

    def isolation(self, worker_id: str) -> None:
        self.heading("bob sends alice's key K1 with the same body")
        response = self.send(
            "bob", "POST", "/v1/workers", key=self.key("K1"), body=self.worker_body()
        )
        self.check_status(response, 201, "bob's request runs for bob")
        bob_worker = (_json(response) or {}).get("id")
        self.check(
            "bob gets his own new worker, not alice's replay",
            not _replayed(response) and bob_worker not in (None, worker_id),
            f"worker {bob_worker}, replayed={_replayed(response)}",
        )
        peek = self.send("bob", "GET", f"/v1/workers/{worker_id}")
        self.check_status(peek, 404, "bob cannot see alice's worker")

    def missing_key(self) -> None:
        self.heading("alice forgets the Idempotency-Key")
        response = self.send("alice", "POST", "/v1/workers", body=self.worker_body())
        self.check_status(response, 400, "a mutating request needs a key")
        self.check(
            "the error is problem+json (RFC 9457)",
            response.headers.get("Content-Type", "").startswith(PROBLEM_JSON),
            f"Content-Type: {response.headers.get('Content-Type')}",
        )

    def renew_lease(self, worker_id: str) -> None:
        self.heading("alice renews the lease (@idempotent function view), then retries")
        path = f"/v1/workers/{worker_id}/renew"
        k3 = self.key("K3")
        first = self.send("alice", "POST", path, key=k3)
        self.check_status(first, 200, "the renewal adds one period")
        again = self.send("alice", "POST", path, key=k3)
        self.check(
            "the retry is a replay (no second period)",
            again.status_code == 200 and _replayed(again) and again.content == first.content,
            f"status {again.status_code}, replayed={_replayed(again)}",
        )
        now = _json(self.send("alice", "GET", f"/v1/workers/{worker_id}", quiet=True)) or {}
        expected = (_json(first) or {}).get("lease_expires_at")
        self.out(f"  lease now ends at {now.get('lease_expires_at')}")
        self.check(
            "the lease was extended once",
            expected is not None and now.get("lease_expires_at") == expected,
            f"expected {expected}, found {now.get('lease_expires_at')}",
        )

    def delete(self, worker_id: str) -> None:
        self.heading("alice deletes the worker (key K4), then retries")
        path = f"/v1/workers/{worker_id}"
        k4 = self.key("K4")
        first = self.send("alice", "DELETE", path, key=k4)
        self.check_status(first, 204, "the delete")
        again = self.send("alice", "DELETE", path, key=k4)
        self.check_status(again, 204, "the retry, though the worker is gone")
        self.check("it is a replay", _replayed(again), "no Idempotent-Replayed header")
        gone = self.send("alice", "GET", path)
        self.check_status(gone, 404, "the worker is gone")
