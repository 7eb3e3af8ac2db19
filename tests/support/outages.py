"""Database outages for a process whose connection goes through a fault proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.faults import Proxy


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    cut = Proxy()
    yield cut
    cut.cut()


def outage_lines(log: list[str]) -> tuple[list[str], list[str]]:
    """The outage's first line (ERROR) and its last (INFO)."""
    started = [line for line in log if "' unavailable (" in line]
    ended = [line for line in log if "available again" in line]
    return started, ended
