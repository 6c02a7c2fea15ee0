"""A sweep interrupted by SIGINT or SIGTERM mid-trial, then `--resume`d (fault campaign row N3): the
final sweep.json holds the same points with the same settings as a sweep that was never interrupted, a
finished trial is not run again (its run folder is untouched), and the cut-short trial is kept aside
and run again in a clean folder. The sweep runs as a real subprocess that launches the simulator."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sweepkit import one_line_error, run_sweep, sweep_scenario, wait_for

pytestmark = pytest.mark.heavy  # sweeps against simulated servers, killed and resumed: tens of seconds each

ARGS = ["--concurrency", "1,2", "--trials", "2", "--goodput", "tpot_ms=40"]
# Figures that are counts or settings, not timings: two sweeps of the same points agree on them exactly.
EXACT = ("concurrency", "trials", "requests", "errors", "findings", "acceptance_length")


def _shape(sweep: dict[str, Any]) -> dict[str, Any]:
    """sweep.json without its timings: every top-level setting, and per point its exact figures and
    the names of its timed ones."""
    return {
        **{k: v for k, v in sweep.items() if k != "variants"},
        "variants": {
            name: [
                {
                    **{k: p[k] for k in EXACT},
                    "timed": sorted(set(p) - set(EXACT)),
                    "spread": sorted(p["spread"]),
                }
                for p in points
            ]
            for name, points in sweep["variants"].items()
        },
    }


def _finished(out: Path) -> dict[str, bytes]:
    """Every finished trial's records and point.json, byte for byte."""
    return {
        str(f.relative_to(out)): f.read_bytes()
        for point in out.glob("K0/*/point.json")
        for f in (point, point.with_name("requests.jsonl"))
    }


@pytest.mark.fault_row("N3")
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_sweep_resumes_to_the_same_sweep(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    path = sweep_scenario(tmp_path, {"K0": ["--step-ms", "60"]})
    whole = run_sweep(tmp_path, str(path), *ARGS, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "cut"
    args = [str(path), *ARGS, "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "sweep", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(out / "K0" / "c1-t2" / "point.json")
        wait_for(out / "K0" / "c2-t1" / "requests.jsonl")  # the third trial has started
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].endswith("continue with the same command and --resume")
    done = _finished(out)
    cut = json.loads((out / "sweep.json").read_text())  # written on the way out: what had finished
    assert [(p["concurrency"], p["requests"]) for p in cut["variants"]["K0"]] == [(1, 4)]

    again = run_sweep(tmp_path, *args, "--resume")
    assert again.returncode == 0, again.stderr
    final = _finished(out)
    assert len(final) == 8 and {k: final[k] for k in done} == done  # finished before: not run again
    names = sorted(p.name for p in (out / "K0").iterdir())
    assert [n for n in names if ".incomplete-" not in n] == ["c1-t1", "c1-t2", "c2-t1", "c2-t2"]
    assert [n for n in names if ".incomplete-" in n and n.startswith("c2-t1.")], names
    resumed = json.loads((out / "sweep.json").read_text())
    assert _shape(resumed) == _shape(json.loads((tmp_path / "whole" / "sweep.json").read_text()))
    assert again.stdout == whole.stdout.replace(str(tmp_path / "whole"), str(out))

    # Done: a further --resume runs nothing and rewrites the same sweep.
    noop = run_sweep(tmp_path, *args, "--resume")
    assert noop.returncode == 0, noop.stderr
    assert _finished(out) == final and sorted(p.name for p in (out / "K0").iterdir()) == names
    assert "requests to" not in noop.stderr


@pytest.mark.fault_row("N3")
def test_a_point_json_that_does_not_read_is_an_unfinished_trial(tmp_path: Path) -> None:
    """Written whole or not at all by itlaudit; cut short by other hands, its trial runs again (the
    folder kept aside) and the others are not touched."""
    path = sweep_scenario(tmp_path, {"K0": ["--step-ms", "30"]})
    out = tmp_path / "sw"
    args = [str(path), "--concurrency", "1,2", "--out", str(out)]
    assert run_sweep(tmp_path, *args).returncode == 0
    (out / "K0" / "c1-t1" / "point.json").write_text('{"load": 1')
    kept = (out / "K0" / "c2-t1" / "requests.jsonl").read_bytes()
    again = run_sweep(tmp_path, *args, "--resume")
    assert again.returncode == 0, again.stderr
    assert "K0 concurrency 1: 2 requests to" in again.stderr and "concurrency 2:" not in again.stderr
    assert (out / "K0" / "c2-t1" / "requests.jsonl").read_bytes() == kept
    assert [p.name.split(".")[0] for p in (out / "K0").glob("c1-t1.incomplete-*")] == ["c1-t1"]
    points = json.loads((out / "sweep.json").read_text())["variants"]["K0"]
    assert [(p["concurrency"], p["requests"]) for p in points] == [(1, 2), (2, 2)]


@pytest.mark.fault_row("N3")
def test_resume_of_a_folder_that_is_not_a_sweep_is_one_line(tmp_path: Path) -> None:
    path = sweep_scenario(tmp_path, {"K0": ["--step-ms", "30"]})
    folder = tmp_path / "sw"
    folder.mkdir()
    one_line_error(
        run_sweep(tmp_path, str(path), *ARGS, "--out", str(folder), "--resume"),
        "--resume needs --out naming a sweep folder",
    )
    (folder / "sweep-config.json").write_text('{"scenario": "simsw')
    one_line_error(
        run_sweep(tmp_path, str(path), *ARGS, "--out", str(folder), "--resume"),
        "sweep-config.json does not read",
        "start a new --out",
    )
    assert [p.name for p in folder.iterdir()] == ["sweep-config.json"]


@pytest.mark.fault_row("R10")
def test_resume_after_the_scenario_was_edited_is_one_line_naming_the_workload(tmp_path: Path) -> None:
    """issue 39 item 5: an edited scenario under the same name resumed silently, mixing 24- and
    12-request points. The workload's digest is in sweep-config.json; a changed one is refused, and the
    same scenario resumes (the clean neighbour). ~6 s (one sweep point and two resumes)."""
    path = sweep_scenario(tmp_path, {"K0": ["--step-ms", "5"]})
    out = tmp_path / "sw"
    args = [str(path), "--concurrency", "1", "--out", str(out)]
    assert run_sweep(tmp_path, *args).returncode == 0
    assert run_sweep(tmp_path, *args, "--resume").returncode == 0
    path.write_text(path.read_text().replace("num_requests = 2", "num_requests = 3"))
    one_line_error(run_sweep(tmp_path, *args, "--resume"), "started with other workload")
