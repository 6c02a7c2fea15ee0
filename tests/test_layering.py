"""The layering rule, read from the package map in docs/development.md, checked against every import.

That table is the one statement of the stage order; this test parses it, so the map a newcomer
reads and the rule CI enforces cannot drift apart. The checker itself is tested on planted graphs, so a
parser that found no imports (or no table) cannot pass by seeing nothing. The same file holds the
tests/ rule: a test module never imports another test module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "itlaudit"
TESTS = ROOT / "tests"
MAP_PAGE = ROOT / "docs" / "development.md"  # its "## The map" section holds the stage table
TOP_LEVEL_ALLOWED = {"__init__", "__main__", "errors"}
# Where an import was seen: (module importing, imported module, line).
Edge = tuple[str, str, int]


def stage_table(page: str) -> list[tuple[str, list[str]]]:
    """(stage, the stages its row says it may import), in row order, from the page's map section."""
    section = page.split("\n## The map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        stage = cells[0].strip("`").rstrip("/")
        rows.append((stage, re.findall(r"`([a-z_]+)/?`", cells[-1])))
    return rows


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str) -> list[tuple[str, int]]:
    """Every itlaudit module `path` imports, at any depth (inside functions too), relative ones resolved."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                package = package if is_package else package[:-1]
                base = ".".join(
                    package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            # `from itlaudit import errors` imports the module itlaudit.errors, not the package.
            found += [
                (f"{base}.{alias.name}" if base == "itlaudit" else base, node.lineno) for alias in node.names
            ]
    return [(name, line) for name, line in found if name == "itlaudit" or name.startswith("itlaudit.")]


def import_graph(root: Path) -> list[Edge]:
    return [
        (module_name(path, root), target, line)
        for path in sorted(root.rglob("*.py"))
        for target, line in imports_of(path, module_name(path, root))
    ]


def stage_of(module: str, order: Sequence[str]) -> int | None:
    """Rank in the order; the package's own `__init__` is below every stage, `__main__` above every
    stage; None for a module in no stage of the table."""
    parts = module.split(".")
    if len(parts) == 1 or (parts[1].startswith("__") and parts[1] != "__main__"):
        return -1  # the package itself, or one of its attributes (`from itlaudit import __version__`)
    if parts[1] == "__main__":
        return len(order)
    return order.index(parts[1]) if parts[1] in order else None


def stage_name(rank: int, order: Sequence[str]) -> str:
    return "itlaudit/__init__" if rank < 0 else "itlaudit/__main__" if rank == len(order) else order[rank]


def violations(edges: Sequence[Edge], order: Sequence[str]) -> list[str]:
    """One line per import that goes up the order, or touches a module the table does not place."""
    found = []
    for source, target, line in edges:
        low, high = stage_of(source, order), stage_of(target, order)
        where = f"{source} (line {line}) imports {target}"
        if low is None or high is None:
            unplaced = source if low is None else target
            found.append(f"{where}: {unplaced} is in no stage of the map in docs/development.md")
        elif high > low:
            found.append(f"{where}: {stage_name(high, order)} is above {stage_name(low, order)}")
    return found


def stray_top_level(root: Path) -> list[str]:
    return sorted(p.stem for p in root.glob("*.py") if p.stem not in TOP_LEVEL_ALLOWED)


@pytest.fixture(scope="module")
def order() -> list[str]:
    return [stage for stage, _ in stage_table(MAP_PAGE.read_text(encoding="utf-8"))]


# --- the rule as docs/development.md states it ---------------------------------------------------


def test_map_places_every_package_and_each_row_may_import_exactly_the_rows_above() -> None:
    table = stage_table(MAP_PAGE.read_text(encoding="utf-8"))
    stages = [stage for stage, _ in table]
    assert stages[0] == "errors" and len(stages) == len(set(stages)) >= 2
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert set(stages) == packages | {"errors"}, "the map's table and itlaudit/'s packages differ"
    for i, (stage, may_import) in enumerate(table):
        assert may_import == stages[:i], f"map row {stage}: 'may import' must list {stages[:i]}"


def test_no_module_imports_from_a_higher_stage(order: list[str]) -> None:
    edges = import_graph(PACKAGE)
    assert len(edges) > 100  # the parser sees the package's imports, so an empty result is not a pass
    assert violations(edges, order) == []


def test_nothing_at_the_top_of_the_package_but_init_main_and_errors() -> None:
    assert stray_top_level(PACKAGE) == []


# --- the checker on planted graphs -----------------------------------------------------------------


def test_checker_names_the_module_and_the_import_that_goes_up(order: list[str]) -> None:
    edges = [
        ("itlaudit.store.rundir", "itlaudit.report.markdown", 12),  # up: the planted violation
        ("itlaudit.report.markdown", "itlaudit.store.rundir", 3),  # down
        ("itlaudit.analysis.metrics", "itlaudit.analysis.findings", 4),  # same stage
        ("itlaudit.__main__", "itlaudit.cli.app", 1),  # the entry point sits above every stage
        ("itlaudit.model.records", "itlaudit", 2),  # the package itself sits below
        ("itlaudit", "itlaudit.errors", 5),  # __init__ importing a stage goes up
        ("itlaudit.plugins.x", "itlaudit.errors", 7),  # a package the table does not know
        ("itlaudit.cli.app", "itlaudit.__main__", 9),  # nothing imports the entry point
    ]
    assert violations(edges, order) == [
        "itlaudit.store.rundir (line 12) imports itlaudit.report.markdown: report is above store",
        "itlaudit (line 5) imports itlaudit.errors: errors is above itlaudit/__init__",
        "itlaudit.plugins.x (line 7) imports itlaudit.errors: itlaudit.plugins.x is in no stage of "
        "the map in docs/development.md",
        "itlaudit.cli.app (line 9) imports itlaudit.__main__: itlaudit/__main__ is above cli",
    ]


def test_parser_sees_function_level_relative_and_package_imports(tmp_path: Path, order: list[str]) -> None:
    package = tmp_path / "itlaudit"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "store" / "__init__.py").write_text("from . import rundir\n")
    (package / "store" / "rundir.py").write_text(
        "import json\nimport itlaudit.model.records\nfrom itlaudit import errors\n\n"
        "def render():\n    from itlaudit.report.markdown import render_markdown\n"
        "    from ..cli import app\n    return render_markdown, app\n"
    )
    (package / "helpers.py").write_text("")
    edges = import_graph(package)
    assert edges == [
        ("itlaudit.store", "itlaudit.store", 1),
        ("itlaudit.store.rundir", "itlaudit.model.records", 2),
        ("itlaudit.store.rundir", "itlaudit.errors", 3),
        ("itlaudit.store.rundir", "itlaudit.report.markdown", 6),
        ("itlaudit.store.rundir", "itlaudit.cli", 7),
    ]
    assert [v.split(":")[0] for v in violations(edges, order)] == [
        "itlaudit.store.rundir (line 6) imports itlaudit.report.markdown",
        "itlaudit.store.rundir (line 7) imports itlaudit.cli",
    ]
    assert stray_top_level(package) == ["helpers"]


def test_table_parser_reads_order_and_may_import_columns() -> None:
    page = (
        "# x\n\n## The map: one package per stage\n\n| stage | owns | may import |\n|---|---|---|\n"
        "| `errors` | errors | — |\n| `model/` | data | `errors` |\n| `cli/` | app | `errors` `model` |\n"
        "\n## Later\n\n| `other` | not | `the map` |\n"
    )
    assert stage_table(page) == [("errors", []), ("model", ["errors"]), ("cli", ["errors", "model"])]


# --- tests/: shared code through conftest.py and helper modules, never another test module -------


def test_checker_finds_imports_of_test_modules(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_x():\n    from test_b import helper\n")
    (tmp_path / "test_b.py").write_text("import conftest\nimport reportkit\nfrom tests import test_a\n")
    (tmp_path / "reportkit.py").write_text("from test_a import x\n")
    assert cross_test_imports(tmp_path) == [
        "reportkit.py line 1 imports test_a",
        "test_a.py line 2 imports test_b",
        "test_b.py line 1 imports conftest",
        "test_b.py line 3 imports test_a",
    ]


def cross_test_imports(directory: Path) -> list[str]:
    """Imports of a test module or conftest from a test module or a helper in `directory`."""
    found = []
    for path in sorted(directory.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names: list[str] = []
            if isinstance(node, ast.Import) or node.module == "tests":
                names = [alias.name for alias in node.names]
            elif node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.removeprefix("tests.").split(".")[0]
                if top == "conftest" or (top.startswith("test_") and (directory / f"{top}.py").exists()):
                    found.append(f"{path.name} line {node.lineno} imports {top}")
    return found


def test_no_test_module_imports_another_test_module() -> None:
    assert cross_test_imports(TESTS) == []
