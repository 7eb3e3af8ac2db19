"""Every Python block of the documentation runs: ``docs/**/*.md`` and ``README.md``.

The blocks are read with Sybil and run in page order, the blocks of one page sharing a
namespace, with pytest-django's database access. A block that cannot run on its own is
marked right before it with Sybil's skip directive and the reason
(``<!-- skip: next "..." -->``); setup a reader does not need runs from an invisible
block (``<!-- invisible-code-block: python ... -->``).

What a page leaves behind is undone after it: the receivers it connected to a signal
and the outbox handlers it registered.
"""

from __future__ import annotations

import re
import unittest
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core import signals as request_signals
from django.db.models import signals as model_signals
from django.dispatch import Signal
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from django_idempotency import signals as idempotency_signals
from django_idempotency.outbox import handlers as outbox_handlers

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: A Python fence, or an invisible Python block.
PYTHON = re.compile(r"^[ \t]*(```python\s*$|<!--\s*invisible-code-block:\s*python)", re.M)
SKIP = SkipParser()
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SKIP], path="../..")


def _pages_with_python() -> list[Path]:
    return [page for page in PAGES if PYTHON.search(page.read_text())]


def _signals() -> Iterator[Signal]:
    for module in (idempotency_signals, model_signals, request_signals):
        for value in vars(module).values():
            if isinstance(value, Signal):
                yield value


@pytest.fixture
def leaves_nothing_behind() -> Iterator[None]:
    receivers = {signal: list(signal.receivers) for signal in _signals()}
    handlers = dict(outbox_handlers._handlers)
    yield
    for signal, before in receivers.items():
        with signal.lock:
            signal.receivers[:] = before
            signal.sender_receivers_cache.clear()
    outbox_handlers._handlers.clear()
    outbox_handlers._handlers.update(handlers)


@pytest.mark.parametrize("page", _pages_with_python(), ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.django_db
def test_the_python_blocks_of_the_page_run(page: Path, leaves_nothing_behind: None) -> None:
    for example in SYBIL.parse(page):
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue  # marked with its reason (test_every_skip_says_why)


def test_every_skip_says_why() -> None:
    for page in PAGES:
        for region in SKIP(SYBIL.parse(page)):
            action, reason = region.parsed
            if action in ("start", "next"):
                assert reason, f"{page.relative_to(ROOT)}: a skip without its reason"
