"""The fault campaign is part of the suite: every row of docs/faults.md has at least one collected test
carrying its `fault_row` marker, every marker names a row there, and every test the page names as
keeping a row is a collected test with that row's marker. A row that loses its test, or a test that
names a row nobody wrote down, fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "faults.md"
ROW_ID = re.compile(r"^(G\d+|N\d+b?|R\d+|\d+b?)$")

# Collect in a fresh interpreter (the suite's own session cannot collect itself again) and print
# each item's fault_row markers; only the modules that mention the marker are collected.
COLLECT = """
import sys, pytest

class Rows:
    def pytest_collection_finish(self, session):
        for item in session.items:
            for mark in item.iter_markers("fault_row"):
                print("fault_row", *mark.args, item.nodeid.split("[")[0])

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Rows()]))
"""


def page_rows() -> dict[str, list[str]]:
    """Row id -> the tests (file::function) the page's table names as keeping it."""
    rows: dict[str, list[str]] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and ROW_ID.match(cells[0]):
            assert cells[0] not in rows, f"row {cells[0]} is twice in {PAGE.name}"
            rows[cells[0]] = re.findall(r"`(tests/[\w/]+\.py::\w+)`", cells[-1])
    return rows


def collected_rows() -> dict[str, set[str]]:
    """Row id -> the collected tests (file::function) that carry its marker."""
    modules = [str(p) for p in sorted((ROOT / "tests").glob("test_*.py")) if "fault_row(" in p.read_text()]
    result = subprocess.run(
        [sys.executable, "-c", COLLECT, *modules], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found: dict[str, set[str]] = defaultdict(set)
    for line in result.stdout.splitlines():
        if line.startswith("fault_row "):
            _, row, test = line.split(" ", 2)
            found[row].add(test)
    return found


def test_every_row_has_a_test_and_every_marker_a_row() -> None:
    rows = page_rows()
    assert len(rows) == 94  # G1, G2, 1-32, 6b; N1-N34, N15b; R1-R16, R31-R38
    found = collected_rows()
    missing = sorted(row for row in rows if not found.get(row))
    unknown = sorted(row for row in found if row not in rows)
    assert not missing, f"rows of docs/faults.md with no test marked fault_row(<id>): {missing}"
    assert not unknown, f"fault_row markers that name no row of docs/faults.md: {unknown}"
    stale = sorted(
        f"{row}: {test}" for row, tests in rows.items() for test in tests if test not in found.get(row, ())
    )
    assert not stale, f"docs/faults.md names tests that do not carry the row's marker: {stale}"
