"""README stays a README: short, and every link from it into docs/ lands on a page and a heading that
exist. `mkdocs build --strict` (scripts/test) checks the links inside docs/; the README lies outside
the site, so this test checks its links the way mkdocs would resolve them (markdown's toc ids)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_ids(page: Path) -> set[str]:
    """The anchors a page's headings get, as mkdocs' toc extension makes them."""
    md: Any = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])  # toc_tokens: set by toc
    md.convert(page.read_text(encoding="utf-8"))

    def walk(tokens: list[dict[str, Any]]) -> set[str]:
        ids: set[str] = set()
        for token in tokens:
            ids.add(token["id"])
            ids |= walk(token["children"])
        return ids

    return walk(md.toc_tokens)


def broken_links(text: str, base: Path) -> list[str]:
    """Each relative link in `text` whose file, or whose #anchor in that file, does not exist."""
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        file = base / path
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in heading_ids(file):
            broken.append(f"{target}: no heading with id {anchor!r}")
    return broken


def test_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_every_readme_link_reaches_its_page_and_heading() -> None:
    text = README.read_text(encoding="utf-8")
    assert "docs/running.md" in text  # the check sees links at all
    assert broken_links(text, ROOT) == []


def test_the_link_check_names_a_missing_page_and_a_missing_heading() -> None:
    text = "[a](docs/capture.md#client-fidelity) [b](docs/nope.md) [c](docs/capture.md#nope) [d](https://x)"
    assert broken_links(text, ROOT) == [
        "docs/nope.md: no such file",
        "docs/capture.md#nope: no heading with id 'nope'",
    ]
