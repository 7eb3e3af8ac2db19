"""Helpers for tests with real concurrent clients (threads, one DB connection each)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from rest_framework.test import APIClient


def token_client(token_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_key}")
    client.raise_request_exception = False
    return client


class Runner:
    """Run callables in threads; each thread closes its own DB connections at the end.

    A thread keeps its connections open until :meth:`join` has every thread's result:
    on PostgreSQL a claim whose session ended is an owner gone (owner presence,
    docs/robustness.md), so a contender that finished early must stay connected while
    the others still contend, as a live client would.
    """

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: list[Any] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._finished = threading.Semaphore(0)
        self._close = threading.Event()
        self._collected = 0

    def start(self, func: Callable[[], Any]) -> threading.Thread:
        def target() -> None:
            try:
                result = func()
                with self._lock:
                    self.results.append(result)
            except BaseException as exc:  # surfaced by join()
                with self._lock:
                    self.errors.append(exc)
            finally:
                self._finished.release()
                self._close.wait(120)
                connections.close_all()

        thread = threading.Thread(target=target, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, timeout: float = 60) -> list[Any]:
        while self._collected < len(self.threads):
            if not self._finished.acquire(timeout=timeout):
                self._close.set()
                raise AssertionError("a client thread did not finish")
            self._collected += 1
        self._close.set()
        for thread in self.threads:
            thread.join(timeout)
            if thread.is_alive():
                raise AssertionError("a client thread did not finish")
        if self.errors:
            raise self.errors[0]
        return self.results
