"""The documentation builds what it shows: Mermaid diagrams become diagrams, and the
install tables name the package's extras.

Builds the site with mkdocs (the ``docs`` extra, installed by ``make install``) into a
temporary folder and reads the HTML, so a change to ``mkdocs.yml`` that turns a diagram
back into a code listing fails here, not in a reader's browser.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class _MermaidBlocks(HTMLParser):
    """Collects the text of every ``<pre class="mermaid">`` / ``<div class="mermaid">``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[str] = []
        self._depth = 0
        self._tag = ""
        self._text: list[str] = []
        self.highlighted = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self._depth:
            if tag == "span":
                self.highlighted = True  # a syntax-highlighted listing, not a diagram
            if tag == self._tag:
                self._depth += 1
        elif tag in ("pre", "div") and "mermaid" in classes:
            self._tag, self._depth, self._text = tag, 1, []

    def handle_endtag(self, tag: str) -> None:
        if self._depth and tag == self._tag:
            self._depth -= 1
            if not self._depth:
                self.blocks.append("".join(self._text))

    def handle_data(self, data: str) -> None:
        if self._depth:
            self._text.append(data)


def _mermaid_fences(page: Path) -> int:
    return len(re.findall(r"^```mermaid\s*$", page.read_text(), flags=re.MULTILINE))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Never skipped: mkdocs-material is in the docs extra, which make install installs.
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(out), "--quiet"],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_state_machine_of_concepts_is_a_mermaid_diagram(site: Path) -> None:
    parser = _MermaidBlocks()
    parser.feed((site / "concepts" / "index.html").read_text())

    assert len(parser.blocks) == 1, parser.blocks
    diagram = parser.blocks[0]
    assert diagram.lstrip().startswith("stateDiagram-v2")
    assert "claimed --> completed" in diagram  # the arrows survived HTML escaping
    assert not parser.highlighted


def test_every_mermaid_fence_of_every_page_is_emitted_as_a_diagram(site: Path) -> None:
    pages = [page for page in DOCS.glob("*.md") if _mermaid_fences(page)]
    assert DOCS / "concepts.md" in pages
    for page in pages:
        parser = _MermaidBlocks()
        parser.feed((site / page.stem / "index.html").read_text())
        assert len(parser.blocks) == _mermaid_fences(page), page.name


def _extras_in_table(page: Path) -> set[str]:
    """The extras named in the first column of ``page``'s tables: ``| `postgres` | ...``."""
    return set(re.findall(r"^\| `([a-z]+)` \|", page.read_text(), flags=re.MULTILINE))


def test_the_install_tables_name_the_package_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for_users = set(extras) - {"test", "lint", "example"}

    assert _extras_in_table(ROOT / "README.md") == for_users
    assert _extras_in_table(DOCS / "quickstart.md") == for_users - {"docs"}
    assert any(dep.startswith("celery[redis]") for dep in extras["redis"])  # redis, packaging
