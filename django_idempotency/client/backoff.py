"""The wait between two attempts: exponential backoff, full jitter, ``Retry-After``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, floored by ``Retry-After``.

    The wait after attempt ``n`` (1-based) is ``uniform(0, min(maximum, initial *
    2 ** (n - 1)))`` seconds ("full jitter"), plus the server's ``Retry-After`` when
    it sent one (capped at ``max_retry_after``), so a retry never comes before the
    server asked and a crowd of clients told the same ``Retry-After`` spreads out.

    Attributes:
        initial: seconds; the ceiling of the first wait.
        maximum: seconds; the largest ceiling of the jitter.
        max_retry_after: seconds; a longer ``Retry-After`` is cut to this.
        random: returns a float in [0, 1); injectable for tests.
    """

    initial: float = 0.1
    maximum: float = 5.0
    max_retry_after: float = 60.0
    random: Callable[[], float] = random.random

    def ceiling(self, attempt: int) -> float:
        """The jitter's upper bound after attempt ``attempt`` (1-based), seconds."""
        try:
            return float(min(self.maximum, self.initial * 2 ** (attempt - 1)))
        except OverflowError:
            return self.maximum

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after attempt ``attempt`` before the next one."""
        jitter = self.random() * self.ceiling(attempt)
        if retry_after is None:
            return jitter
        return min(max(retry_after, 0.0), self.max_retry_after) + jitter
