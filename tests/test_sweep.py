"""`itlaudit sweep` end to end on launched simulators whose steps slow with the batch: the crossover
where K3 stops paying off, the SLA limit of a TPOT that grows linearly with concurrency, resume after
SIGKILL, and the one-line refusals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sweepkit import one_line_error as _one_line_error
from sweepkit import run_sweep as _sweep
from sweepkit import sweep_scenario as _scenario
from sweepkit import wait_for as _wait_for

# Step 10 ms; with spec decode on, each stream beyond the first adds 5 ms. K3 (full acceptance, 4
# tokens a step) costs (10 + 5·(c−1))/4 ms a token against K0's 10: faster up to c = 6, slower past it.
LOADED = ["--step-ms", "10", "--spec-verify-ms-per-stream", "5"]


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_crossover_found_between_the_points_that_bracket_it(tmp_path: Path) -> None:
    path = _scenario(tmp_path, {"K0": LOADED, "K3": [*LOADED, "--num-speculative-tokens", "3"]}, "")
    out = tmp_path / "sw"
    result = _sweep(
        tmp_path, str(path), "--concurrency", "1,4,16", "--out", str(out), "--goodput", "tpot_ms=9"
    )
    assert result.returncode == 0, result.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    (found,) = sweep["crossovers"]
    assert (found["variant"], found["base"], found["last_faster"], found["first_slower"]) == (
        "K3",
        "K0",
        4,
        16,
    )
    assert "K3 is faster per token up to concurrency 4" in result.stdout
    assert "at 16, K0 is" in found["headline"]
    k3 = {p["concurrency"]: p for p in sweep["variants"]["K3"]}
    # Expected per-token ITL at c=4: (10 + 15)/4 = 6.25 ms; chunk ITL is the whole 25 ms step.
    assert 6.0 < k3[4]["itl_ms"]["p50"] < 8.0 and 24.0 < k3[4]["chunk_itl_ms"]["p50"] < 30.0
    assert 3.5 < k3[4]["acceptance_length"] <= 4.0 and k3[16]["requests"] == 16
    # Goodput on TPOT ≤ 9 ms: at c=1 every K3 request meets it by token TPOT, none by chunk ITL (~10 ms).
    assert k3[1]["goodput_rps"] > 0 and k3[1]["goodput_chunk_rps"] == 0
    # One server per variant, every point against it; each point a run folder `itlaudit report` reads.
    urls = {json.loads(m.read_text())["variants"]["K3"]["url"] for m in out.glob("K3/*/meta.json")}
    assert len(urls) == 1 and len(list(out.glob("server-*.log"))) == 2
    for name in ("sweep_itl_vs_throughput.png", "sweep_ttft_vs_load.png", "sweep_speedup_vs_load.png"):
        assert (out / name).stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert found["headline"] in report and "sweep_speedup_vs_load.png" in report
    assert "<img" in (out / "report.html").read_text()
    again = subprocess.run(
        [sys.executable, "-m", "itlaudit", "report", str(out / "K3" / "c4-t1")],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_sla_search_finds_the_limit_of_a_linear_tpot(tmp_path: Path) -> None:
    """TPOT = 5 ms × concurrency (step 5 ms, +5 ms per extra stream): tpot_p99 ≤ 52.5 holds up to 10."""
    path = _scenario(tmp_path, {"K0": ["--step-ms", "5", "--batch-slowdown-ms-per-stream", "5"]})
    out = tmp_path / "sw"
    result = _sweep(
        tmp_path, str(path), "--concurrency", "1,4,16", "--out", str(out), "--sla", "tpot_p99_ms<=52.5"
    )
    assert result.returncode == 0, result.stderr
    sla = json.loads((out / "sweep.json").read_text())["sla"]["variants"]["K0"]
    assert (sla["limit"], sla["failed_at"], sla["above_range"]) == (10, 11, False)
    assert 49.0 < sla["point"]["tpot_ms"]["p99"] <= 52.5
    assert "K0: highest concurrency 10 meeting tpot_p99_ms<=52.5" in result.stdout
    assert sorted(p.name for p in (out / "K0").iterdir()) == sorted(
        f"c{c}-t1" for c in (1, 4, 10, 11, 13, 16)
    )


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_resume_after_sigkill_skips_finished_points(tmp_path: Path) -> None:
    path = _scenario(tmp_path, {"K0": ["--step-ms", "30"]})
    out = tmp_path / "sw"
    args = [str(path), "--concurrency", "1,2", "--trials", "2", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "sweep", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for(out / "K0" / "c1-t1" / "point.json")
    _wait_for(out / "K0" / "c1-t2" / "requests.jsonl")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    first = (out / "K0" / "c1-t1" / "requests.jsonl").read_bytes()
    again = _sweep(tmp_path, *args, "--resume")
    refused = _sweep(tmp_path, *args)
    assert again.returncode == 0, again.stderr
    assert (out / "K0" / "c1-t1" / "requests.jsonl").read_bytes() == first  # finished: not run again
    names = sorted(p.name for p in (out / "K0").iterdir())
    assert [n for n in names if ".incomplete-" not in n] == ["c1-t1", "c1-t2", "c2-t1", "c2-t2"]
    assert any(n.startswith("c1-t2.incomplete-") for n in names)  # the killed trial, kept aside
    points = json.loads((out / "sweep.json").read_text())["variants"]["K0"]
    assert [(p["concurrency"], p["trials"], p["requests"]) for p in points] == [(1, 2, 4), (2, 2, 4)]
    _one_line_error(refused, "already holds a sweep", "--resume")
    changed = _sweep(tmp_path, str(path), "--concurrency", "1,4", "--out", str(out), "--resume")
    _one_line_error(changed, "started with other", "trials", "values")


def test_fail_on_findings_exits_1_when_a_point_has_findings(tmp_path: Path) -> None:
    """A server capping every reply at 4 tokens: the sweep finishes, writes its report, and exits 1
    (as run and compare do). ~6 s."""
    path = _scenario(tmp_path, {"K0": ["--step-ms", "1", "--cap-tokens", "4"]})
    out = tmp_path / "sw"
    result = _sweep(tmp_path, str(path), "--concurrency", "1", "--out", str(out), "--fail-on-findings")
    assert result.returncode == 1, result.stderr
    assert (out / "report.md").is_file() and json.loads((out / "sweep.json").read_text())["variants"]["K0"][
        0
    ]["findings"]


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_rate_sweep_runs_open_loop_points_at_the_asked_rates(tmp_path: Path) -> None:
    """--rate: each point is the scenario on open-loop arrivals at that rate, not capped by the
    scenario's closed-loop concurrency."""
    path = _scenario(tmp_path, {"K0": ["--step-ms", "2"]}, "concurrency = 1\nseed = 3")
    out = tmp_path / "sw"
    result = _sweep(tmp_path, str(path), "--rate", "5,50", "--out", str(out), "--fail-on-findings")
    assert result.returncode == 0, result.stderr  # no finding: --fail-on-findings keeps quiet
    points = json.loads((out / "sweep.json").read_text())["variants"]["K0"]
    assert [p["rate"] for p in points] == [5, 50]
    assert all(p["requests"] == 2 for p in points)
    for label, rate in (("r5", 5.0), ("r50", 50.0)):
        run = out / "K0" / f"{label}-t1"
        lines = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
        scheduled = sorted(line["scheduled_ms"] for line in lines)
        # two requests on a seeded schedule at `rate`: the second is due about 1/rate after the first
        assert scheduled[1] - scheduled[0] == pytest.approx(1000 / rate, rel=0.6)
        assert max(line["sent_offset_ms"] - line["scheduled_ms"] for line in lines) < 1000 / rate


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--concurrency", "1", "--rate", "2"], ["exactly one of"]),
        ([], ["exactly one of"]),
        (["--concurrency", "1,a"], ["'a' is not a number"]),
        (["--concurrency", "1", "--sla", "tpot<=3"], ["cannot read 'tpot<=3'"]),
        (["--concurrency", "1", "--goodput", "tpot_ms=-1"], ["--goodput"]),
        (["--concurrency", "1", "--only", "K9"], ["--only 'K9' is not in the scenario"]),
        (["--concurrency", "1", "--resume", "--out", "nowhere"], ["--resume needs --out"]),
        (["--concurrency", "1", "--workers", "0"], ["--workers '0'"]),
        (["--concurrency", "1", "--trials", "0"], ["--trials 0"]),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    path = _scenario(tmp_path, {"K0": []})
    _one_line_error(_sweep(tmp_path, str(path), *args), *needles)


@pytest.mark.vllm
def test_vllm_cpu_k_sweep_answers_the_best_k_per_load(tmp_path: Path) -> None:
    """Real vLLM CPU, the issue's "which K?" (scenarios/cpu-k-sweep.toml): one server per K (0, 1, 3,
    set inside --speculative-config; K0 without it), each at two loads, the best K per load named in
    words and drawn per K. CI cost: ~70 s (three server starts, 6 points of 2 × 48 tokens)."""
    scenario = Path(__file__).parent.parent / "scenarios" / "cpu-k-sweep.toml"
    out = tmp_path / "sw"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "itlaudit",
            "sweep",
            str(scenario),
            "--concurrency",
            "1,2",
            "--num-prompts",
            "2",
            "--max-tokens",
            "48",
            "--out",
            str(out),
            "--sla",
            "tpot_p99_ms<=1000",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    assert list(sweep["variants"]) == ["draft-K0", "draft-K1", "draft-K3"]
    assert [p["concurrency"] for p in sweep["variants"]["draft-K3"]] == [1, 2]
    # Self-drafting at temperature 0: every draft accepted, K+1 tokens a chunk.
    assert all(p["acceptance_length"] > 3.5 for p in sweep["variants"]["draft-K3"])
    assert all(1.8 < p["acceptance_length"] <= 2.0 for p in sweep["variants"]["draft-K1"])
    meta = {
        name: json.loads(next((out / name).glob("*/meta.json")).read_text())["variants"][name]
        for name in sweep["variants"]
    }
    assert meta["draft-K0"].get("speculative_config") is None  # speculation off, not K=0 by a schedule
    assert meta["draft-K1"]["speculative_config"]["num_speculative_tokens"] == 1
    best = {b["load"]: b for b in sweep["best"]}
    assert set(best) == {1, 2} and all(b["by_itl"] in sweep["variants"] for b in best.values())
    for b in best.values():
        at = [next(p for p in sweep["variants"][n] if p["concurrency"] == b["load"]) for n in meta]
        # (a point whose replies came in one read has no token ITL, and is never the answer)
        assert b["itl_ms"] == min(p["itl_ms"]["p50"] for p in at if p["itl_ms"]["p50"] is not None)
        assert b["words"] in result.stdout
    assert len(sweep["crossovers"]) == 2  # K1 and K3 each against K0
    for name in ("sweep_itl_by_setting.png", "sweep_itl_vs_throughput.png", "sweep_speedup_vs_load.png"):
        assert (out / name).stat().st_size > 10_000
    print(result.stdout)
