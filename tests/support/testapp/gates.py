"""Barriers the concurrency tests use to hold a view mid-flight (no sleeps)."""

from __future__ import annotations

import threading


class Gate:
    """``entered`` is set when a view reaches the gate; the view then waits for ``opened``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def pass_through(self, timeout: float = 30) -> None:
        with self.lock:
            self.calls += 1
        self.entered.set()
        if not self.opened.wait(timeout):
            raise RuntimeError("gate was never opened")


GATES: dict[str, Gate] = {}
HOOKS: dict[str, object] = {}
