"""The layering rule, read from the package map in docs/development.md, checked against every import.

That table is the one statement of the stage order; this test parses it, so the map a newcomer
reads and the rule CI enforces cannot drift apart. The checker itself is tested on planted graphs, so a
parser that found no imports (or no table) cannot pass by seeing nothing. The same file holds the
tests/ rule: a test module never imports another test module.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "itlaudit"
TESTS = ROOT / "tests"
MAP_PAGE = ROOT / "docs" / "development.md"  # its "## The map" section holds the stage table
TOP_LEVEL_ALLOWED = {"__init__", "__main__", "errors"}
# Where an import was seen: (module importing, imported module, line).
Edge = tuple[str, str, int]
# A name taken by `from ... import`: (module importing, module it is taken from, name, line).
NameImport = tuple[str, str, str, int]
# What a stage package offers other stages: {name: the submodule it lives in}, submodules offered whole.
StageSurface = tuple[Mapping[str, str], Sequence[str]]


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


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` takes its names from, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    package = package if is_package else package[:-1]
    return ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))


def imports_of(path: Path, module: str) -> list[tuple[str, int]]:
    """Every itlaudit module `path` imports, at any depth (inside functions too), relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, path.name == "__init__.py")
            # `from itlaudit import errors` imports the module itlaudit.errors, not the package; a
            # dunder or CapWords name (`__version__`, `Surface`) is the package's own attribute.
            found += [
                (
                    f"{base}.{alias.name}" if base == "itlaudit" and _is_module_name(alias.name) else base,
                    node.lineno,
                )
                for alias in node.names
            ]
    return [(name, line) for name, line in found if name == "itlaudit" or name.startswith("itlaudit.")]


def _is_module_name(name: str) -> bool:
    return not name.startswith("__") and name == name.lower()


def imported_names(root: Path) -> list[NameImport]:
    """Every `from itlaudit.x import name` in the package, at any depth: who, from where, which name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = _from_base(node, module, path.name == "__init__.py")
                if base.startswith("itlaudit."):
                    found += [(module, base, alias.name, node.lineno) for alias in node.names]
    return found


def surface_violations(imports: Sequence[NameImport], surfaces: Mapping[str, StageSurface]) -> list[str]:
    """One line per name a module takes from another stage's package that the package's surface does
    not offer, or offers from another submodule (its home). A stage without a surface (`errors`, a
    module whose whole tree is its API; `cli`, the top) is not checked, nor is the entry point."""
    found = []
    for source, target, name, line in imports:
        parts, source_parts = target.split("."), source.split(".")
        stage = parts[1]
        if stage not in surfaces or source_parts[1:2] in ([stage], ["__main__"]):
            continue
        homes, modules = surfaces[stage]
        home = ".".join(parts[2:])
        where = f"{source} (line {line}) imports {name} from {target}"
        # through the package itself any surface name or module will do; from a submodule, its home
        if (homes.get(name) == home) if home else (name in homes or name in modules):
            continue
        if name in homes:
            found.append(f"{where}: itlaudit.{stage} offers it from itlaudit.{stage}.{homes[name]}")
        else:
            found.append(
                f"{where}: not in itlaudit.{stage}'s surface (add it to itlaudit/{stage}/__init__.py's "
                "SURFACE if other stages may use it)"
            )
    return found


def stage_surfaces(order: Sequence[str]) -> dict[str, StageSurface]:
    """Each stage package's surface, as its `SURFACE` declares it (cli, the top, and errors have none)."""
    surfaces = {}
    for stage in order:
        if stage in ("errors", "cli"):
            continue
        surface = importlib.import_module(f"itlaudit.{stage}").SURFACE
        surfaces[stage] = (surface.homes, surface.modules)
    return surfaces


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


def test_other_stages_import_only_what_a_package_offers(order: list[str]) -> None:
    imports = imported_names(PACKAGE)
    assert len(imports) > 300  # the parser sees the package's names, so an empty result is not a pass
    assert surface_violations(imports, stage_surfaces(order)) == []


def test_each_surface_name_lives_in_its_home_and_resolves_through_the_package(order: list[str]) -> None:
    """A surface cannot name what its package does not have: each name is in the submodule it names,
    `__all__` is the surface, and the package hands out the same object (loaded on first use)."""
    for stage, (homes, modules) in stage_surfaces(order).items():
        package = importlib.import_module(f"itlaudit.{stage}")
        assert package.__all__ == [*homes, *modules], stage
        for name, home in homes.items():
            value = getattr(importlib.import_module(f"itlaudit.{stage}.{home}"), name)
            # a name that is also a submodule's (track.record.record) is that submodule once it loads
            if name not in {p.stem for p in (PACKAGE / stage).iterdir()}:
                assert getattr(package, name) is value, f"itlaudit.{stage}.{name}"
        for name in modules:
            assert getattr(package, name) is importlib.import_module(f"itlaudit.{stage}.{name}")
        with pytest.raises(AttributeError, match="has no attribute 'not_offered'"):
            package.not_offered  # noqa: B018


def test_each_surface_offers_only_what_other_stages_take_and_is_the_one_statement(order: list[str]) -> None:
    """A package's SURFACE is the one place its public names are stated (issue 37 item 6): a stage's
    modules declare no `__all__` of their own, and every name or module a surface offers is imported
    by some module of another stage, so the surface is cut to what is used."""
    declaring = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.glob("*/**/*.py")
        if path.name != "__init__.py"
        and "__all__"
        in {
            target.id
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
    ]
    assert declaring == []
    taken = {
        (target.split(".")[1], name)
        for source, target, name, _ in imported_names(PACKAGE)
        if target.split(".")[1] != source.split(".")[1]
    }
    unused = [
        f"itlaudit.{stage}: {name}"
        for stage, (homes, modules) in stage_surfaces(order).items()
        for name in [*homes, *modules]
        if (stage, name) not in taken
    ]
    assert unused == []


def test_importing_a_stage_package_loads_none_of_its_modules(order: list[str]) -> None:
    """The surfaces are lazy: `import itlaudit.analysis` costs its __init__, not the stage."""
    stages = [stage for stage in order if stage != "errors"]
    code = (
        f"import importlib, sys\nfor s in {stages!r}:\n    importlib.import_module('itlaudit.' + s)\n"
        "print(sorted(m for m in sys.modules if m.startswith('itlaudit.') and m.count('.') > 1))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


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


def test_surface_checker_names_the_import_and_where_the_name_is_offered() -> None:
    surfaces: dict[str, StageSurface] = {"analysis": ({"RunSummary": "summary"}, ("stats",))}
    imports = [
        ("itlaudit.report.markdown", "itlaudit.analysis.summary", "RunSummary", 3),  # offered, its home
        ("itlaudit.report.markdown", "itlaudit.analysis.summary", "_figures", 4),  # not offered
        ("itlaudit.report.markdown", "itlaudit.analysis.derive", "RunSummary", 5),  # offered elsewhere
        ("itlaudit.report.markdown", "itlaudit.analysis", "stats", 6),  # a module offered whole
        ("itlaudit.report.markdown", "itlaudit.analysis", "RunSummary", 7),  # through the package
        ("itlaudit.report.markdown", "itlaudit.analysis", "metrics", 8),  # a module not offered
        ("itlaudit.analysis.derive", "itlaudit.analysis.metrics", "p50", 9),  # its own stage: free
        ("itlaudit.report.markdown", "itlaudit.errors", "ItlauditError", 10),  # no surface: the tree
        ("itlaudit.__main__", "itlaudit.analysis.x", "main", 11),  # the entry point
    ]
    assert surface_violations(imports, surfaces) == [
        "itlaudit.report.markdown (line 4) imports _figures from itlaudit.analysis.summary: not in "
        "itlaudit.analysis's surface (add it to itlaudit/analysis/__init__.py's SURFACE if other stages "
        "may use it)",
        "itlaudit.report.markdown (line 5) imports RunSummary from itlaudit.analysis.derive: "
        "itlaudit.analysis offers it from itlaudit.analysis.summary",
        "itlaudit.report.markdown (line 8) imports metrics from itlaudit.analysis: not in "
        "itlaudit.analysis's surface (add it to itlaudit/analysis/__init__.py's SURFACE if other stages "
        "may use it)",
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
