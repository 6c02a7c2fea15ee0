"""One server lifecycle and one measure step (issue 37 item 2), read from the package's calls: every
command that starts or attaches to a variant's server does it through `VariantServer.open`
(workflows/server.py), and every pass over a variant is `RunFolder.measure` (workflows/run_folder.py).
The commands' own tests run them end to end (and tests/test_secrets_campaign.py checks their server
logs masked); this one keeps a new command from growing a lifecycle of its own. ~1 s: an AST walk."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "itlaudit"


def calls_by_module() -> dict[str, set[str]]:
    """Per module of the package, the names it calls: `f(...)` as f, `a.b(...)` as `a.b`."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).with_suffix("").as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name):
                    found[module].add(func.id)
                elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                    found[module].add(f"{func.value.id}.{func.attr}")
    return found


def callers(calls: dict[str, set[str]], name: str) -> set[str]:
    return {module for module, names in calls.items() if name in names}


def test_servers_are_launched_only_by_the_lifecycle_and_passes_built_only_by_measure() -> None:
    calls = calls_by_module()
    assert len(calls) > 100  # the walk sees the package
    # serve/launcher.launch: the lifecycle, and selfcheck's truth server (the instrument that grades
    # the client, not a variant: its log is truth-server.log beside the trials).
    assert callers(calls, "launch") == {"workflows/server", "workflows/selfcheck"}
    assert callers(calls, "VariantPass") == {"workflows/run_folder"}


def test_every_command_opens_its_servers_and_measures_through_the_shared_steps() -> None:
    calls = calls_by_module()
    opened = callers(calls, "VariantServer.open")
    measured = {module for module, names in calls.items() if any(n.endswith(".measure") for n in names)}
    # run and compare (run_scenario; compare's scoring server too), sweep, bisect and nightly probes
    # (run_probe), smoke, the invariance audit.
    assert opened == {
        "workflows/run",
        "workflows/compare",
        "workflows/sweep",
        "bisect/probe",
        "smoke/runner",
        "workflows/audit",
    }
    assert measured == {"workflows/run", "workflows/sweep", "bisect/probe"}
    # The commands built on those: compare and smoke run run_scenario (smoke through run_compare), track
    # nightly and bisect run run_probe.
    assert "run_scenario" in calls["workflows/compare"] and "run_compare" in calls["smoke/runner"]
    assert "run_probe" in calls["bisect/bisector"] and "run_probe" in calls["track/nightly"]
