"""The GPU lane's CUDA-graph stage (tests/fixtures/gpu/gemma-graphs-h100; issue 35 item 8): Gemma 3
270M on an H100 eager, with CUDA graphs, and ngram K=3 with CUDA graphs, re-derived on this CPU machine
by `itlaudit report`. What the H100 measured comes back out of the folder: the memory-bandwidth floor
from the model's config and NVML's device name, each variant's share of it, the GPU energy per output
token from NVML's counter, launch_bound where the GPU idled far from the floor, and the recorded greedy
mismatches read as what they are once the servers' execution modes are known. CI cost: ~4 s."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from itlaudit.analysis.lossless import with_execution_modes
from itlaudit.model.codes import Finding

FIXTURE = Path(__file__).parent / "fixtures" / "gpu" / "gemma-graphs-h100"
MODES = {"G0": "eager", "G0G": "compiled", "GNGG": "compiled"}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("graphs") / "run"
    shutil.copytree(FIXTURE, folder)
    (folder / "summary.json").unlink()  # derived again here
    proc = subprocess.run(
        [sys.executable, "-m", "itlaudit", "report", str(folder)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return folder


def test_the_floor_energy_and_launch_bound_come_back_as_measured(reported: Path) -> None:
    summary, written = _json(reported / "summary.json"), _json(FIXTURE / "summary.json")
    for variant in MODES:
        server = summary["server"][variant]
        assert server == written["server"][variant]  # the H100's own derivation, to the digit
        assert server["floor_device"] == "NVIDIA H100 80GB HBM3" and server["floor_bandwidth_gbps"] == 3350.0
        assert server["floor_bytes_per_step"] == pytest.approx(0.542e9, rel=1e-3)  # 270M params in bf16 + KV
        assert server["gpu_energy_source"] == "nvml_energy_counter" and server["gpu_energy_coverage"] == 1.0
        # idle GPU (13-19 % busy), far from the floor (0.4-6.3 %): the step waits on the host
        assert server["gpu_util_p50_pct"] < 50 and server["floor_share"] < 0.10
        assert summary["variants"][variant]["findings"]["launch_bound"] == 1
    g0, g0g = summary["server"]["G0"], summary["server"]["G0G"]
    itl = {v: summary["variants"][v]["itl_ms"]["p50"] for v in MODES}
    # CUDA graphs: 16x faster per token than eager, and 12x less energy a token
    assert (
        15 < itl["G0"] / itl["G0G"] < 17
        and g0["gpu_joules_per_output_token"] > 10 * g0g["gpu_joules_per_output_token"]
    )
    assert g0g["floor_share"] == pytest.approx(g0g["floor_ms"] / itl["G0G"])
    report = (reported / "report.md").read_text(encoding="utf-8")
    assert "of NVIDIA H100 80GB HBM3's bandwidth floor 0.162 ms" in report and "launch_bound" in report
    # the 16x is said, and with it that both sides are launch-bound: a ratio to read over trials
    assert "G0 and G0G are launch-bound (`launch_bound`): the ratio moves with the host's CPU" in report


def test_the_greedy_mismatches_are_numerics_at_near_ties_once_the_modes_are_known() -> None:
    """Recorded without the scenario's execution modes: 12 errors, 6 of them against G0G, which does not
    speculate. Every one sits at a K0 top-2 margin of at most 0.125 nats; with G0 eager and G0G/GNGG
    compiled (the scenario now declares them) each is a warning naming the two execution modes."""
    compared = _json(FIXTURE / "compare.json")
    found = [Finding.from_json(f) for f in compared["findings"]]
    assert len(found) == 14 and sum(f.severity == "error" for f in found) == 12
    assert all(f.evidence["near_tie"] and f.evidence["base_top2_margin"] <= 0.125 for f in found)
    assert compared["variants"]["G0G"]["spec_decode"] is None  # no drafts: not speculating
    judged = [
        with_execution_modes(
            f, "eager", MODES[f.request_id.split("-")[0]], speculates=f.request_id.startswith("GNGG")
        )
        for f in found
    ]
    assert all(f.severity == "warning" for f in judged)
    assert all("numerics differ between execution modes (eager vs compiled)" in f.message for f in judged)
