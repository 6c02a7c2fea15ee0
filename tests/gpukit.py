"""What the GPU-lane fixture tests share: the lane's scripts loaded as modules, and a run re-derived.

Both tests/test_gpu_fixtures.py (the tiny models) and tests/test_gpu_gemma_fixtures.py (the real model)
replay run folders written by `scripts/gpu/lane` on the device through itlaudit's analysis path, and
check scripts/gpu/tpot.py and scripts/gpu/prepare, which are scripts, not package modules.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from itlaudit.analysis.comparison import build_comparison
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.specdecode import CounterSnapshot, spec_decode_delta
from itlaudit.store.jsonl import load_records

GPU_SCRIPTS = Path(__file__).parents[1] / "scripts" / "gpu"


def gpu_script(name: str) -> ModuleType:
    """scripts/gpu/NAME as a module (`prepare` has no .py suffix, so a plain import cannot load it)."""
    path = GPU_SCRIPTS / name
    loader = importlib.machinery.SourceFileLoader(f"gpu_{path.stem}", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def rederive(run: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """summary and comparison from requests.jsonl and meta.json's counters, as `itlaudit report` does;
    the comparison in compare.json's form, which the fixture tests hold it against."""
    meta = json.loads((run / "meta.json").read_text())
    records = load_records(run / "requests.jsonl")
    summary = summarize_run(records, list(meta["variants"]))
    stats = {
        name: spec_decode_delta(CounterSnapshot.from_json(v["before"]), CounterSnapshot.from_json(v["after"]))
        for name, v in meta["variants"].items()
    }
    return summary.to_json(), build_comparison(summary, records, stats).to_json()


def same_as_recorded(
    derived: dict[str, Any], recorded: dict[str, Any], changed: tuple[str, ...] = ()
) -> bool:
    """Every figure a lane run's own itlaudit wrote into a block, derived again here to the digit. A figure
    added to the block since is not a difference (the recorded block cannot hold it); one whose
    definition changed since is named in `changed` and left out."""
    kept = {key: value for key, value in recorded.items() if key not in changed}
    return {key: derived.get(key) for key in kept} == kept
