"""`sweep --serve-param` / [sweep.serve] (issue 35 item 4, "which K?"): one launched server per
setting, set inside vLLM's --speculative-config (K0 drops it), the best setting per load answered by
token ITL among comparable points, and the one-line refusals. On launched simulators that speak vLLM's
--speculative-config; the real-engine case is tests/test_sweep.py's vLLM CPU K sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweepkit import one_line_error, run_sweep, sweep_scenario

from itlaudit.analysis.sweep import best_settings
from itlaudit.errors import ScenarioError
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.serve_params import apply_setting, parse_serve_param
from itlaudit.model.vocabulary import LoadAxis

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
# Step 10 ms; speculating, each stream beyond the first adds 20 ms: K3 is 2.5 ms a token at
# concurrency 1 (4 tokens a step), K0 10 ms; at 3 streams K3 is (10 + 40) / 4 = 12.5 ms, K1 25, K0 10.
LOADED = ["--step-ms", "10", "--spec-verify-ms-per-stream", "20", "--speculative-config", NGRAM]


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_the_best_k_moves_with_the_load(tmp_path: Path) -> None:
    """[sweep.serve] K = 0, 1, 3 at concurrency 1 and 3: K3 is best alone, K0 under load. CI cost: ~12 s
    (three simulators, six points)."""
    path = sweep_scenario(
        tmp_path, {"ngram": LOADED}, tables="[sweep.serve]\nnum_speculative_tokens = [0, 1, 3]\n"
    )
    out = tmp_path / "sw"
    result = run_sweep(tmp_path, str(path), "--concurrency", "1,3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    sweep = json.loads((out / "sweep.json").read_text())
    assert list(sweep["variants"]) == ["ngram-K0", "ngram-K1", "ngram-K3"]
    assert sweep["settings"]["ngram-K1"] == {"variant": "ngram", "num_speculative_tokens": 1}
    best = {b["load"]: b["by_itl"] for b in sweep["best"]}
    assert best == {1: "ngram-K3", 3: "ngram-K0"}
    assert "ngram at concurrency 1: K3 has the lowest token ITL" in result.stdout
    assert sweep["headline"][0].startswith("ngram at concurrency 1: K3")  # the answer leads
    # Each server was started with its own argument: K0 with none (speculation off).
    spec = {
        n: json.loads(next((out / n).glob("*/meta.json")).read_text())["variants"][n].get(
            "speculative_config"
        )
        for n in sweep["variants"]
    }
    assert spec["ngram-K0"] is None and spec["ngram-K3"] == json.loads(NGRAM)
    assert spec["ngram-K1"] == {**json.loads(NGRAM), "num_speculative_tokens": 1}
    assert (out / "sweep_itl_by_setting.png").stat().st_size > 10_000
    assert "K3 has the lowest token ITL" in (out / "report.md").read_text()
    # --resume asks the same settings: another grid is another experiment.
    again = run_sweep(
        tmp_path, str(path), "--concurrency", "1,3", "--out", str(out), "--resume",
        "--serve-param", "num_speculative_tokens=0,2",
    )  # fmt: skip
    one_line_error(again, "started with other", "serve")


POINT = {"requests": 2, "errors": 0, "findings": 0, "goodput_rps": None}


def _point(load: int, itl: float, why: str | None = None) -> dict[str, object]:
    point = {**POINT, "concurrency": load, "itl_ms": {"p50": itl, "p90": itl, "p99": itl}}
    return {**point, "not_comparable": why} if why else point


def test_a_setting_that_is_not_comparable_is_never_the_best() -> None:
    """The fastest point was cut short: the answer is the fastest comparable one, and the one left
    out is named. ~0 s."""
    settings = {f"v-K{k}": {"variant": "v", "num_speculative_tokens": k} for k in (0, 3)}
    series = {"v-K0": [_point(1, 10.0)], "v-K3": [_point(1, 2.0, "outputs cut short")]}
    (found,) = best_settings(LoadAxis.CONCURRENCY, series, settings)
    assert found.by_itl == "v-K0" and found.left_out == {"v-K3": "outputs cut short"}
    assert found.words.endswith("not comparable: K3 (outputs cut short).")
    series["v-K3"] = [_point(1, 2.0)]  # the quiet side: comparable, and faster
    assert best_settings(LoadAxis.CONCURRENCY, series, settings)[0].by_itl == "v-K3"


def test_settings_reach_the_arguments_vllm_reads() -> None:
    """Speculative keys inside the JSON argument, other names as flags (replaced, added, removed).
    ~0 s."""
    launch = LaunchSpec(
        kind=LaunchKind.PYTHON,
        python="py",
        server_args=["--max-num-seqs", "8", f"--speculative-config={NGRAM}", "--enforce-eager"],
    )
    changed = apply_setting(
        launch, {"num_speculative_tokens": 5, "max_num_seqs": 16, "enforce_eager": False}, "v"
    )
    assert changed.server_args[:2] == ["--max-num-seqs", "16"]
    assert "--enforce-eager" not in changed.server_args
    assert changed.speculative_config == {**json.loads(NGRAM), "num_speculative_tokens": 5}
    off = apply_setting(launch, {"num_speculative_tokens": 0, "enable_prefix_caching": True}, "v")
    assert off.speculative_config is None and off.server_args[-1] == "--enable-prefix-caching"
    assert parse_serve_param("--max-num-seqs=8,16") == ("max_num_seqs", [8, 16])
    with pytest.raises(ScenarioError, match="no --speculative-config"):
        apply_setting(LaunchSpec(kind=LaunchKind.PYTHON, python="py"), {"num_speculative_tokens": 3}, "v")


@pytest.mark.parametrize(
    ("args", "tables", "needles"),
    [
        (["--serve-param", "num_speculative_tokens"], "", ["write NAME=V1,V2"]),
        (["--serve-param", "num_speculative_tokens=1,-1"], "", ["whole numbers from 0"]),
        (["--serve-param", "max_num_seqs=8,8"], "", ["repeats a value"]),
        (["--serve-param", "num_speculative_tokens=0,3", "--url", "http://127.0.0.1:9"], "", ["--url"]),
        ([], "[sweep.serve]\nnum_speculative_tokens = 3\n", ["give a list of values"]),
        ([], "[sweep]\nserve_params = {}\n", ["serve_params", "not a known key"]),
    ],
)
def test_bad_serve_params_are_one_line(
    tmp_path: Path, args: list[str], tables: str, needles: list[str]
) -> None:
    """Each refusal before any server starts. ~1 s each."""
    path = sweep_scenario(tmp_path, {"ngram": LOADED}, tables=tables)
    one_line_error(run_sweep(tmp_path, str(path), "--concurrency", "1", *args), *needles)


def test_a_setting_a_server_cannot_take_is_one_line(tmp_path: Path) -> None:
    """K3 for a variant launched without --speculative-config: nothing to set it in. ~1 s."""
    path = sweep_scenario(tmp_path, {"plain": []})
    result = run_sweep(
        tmp_path, str(path), "--concurrency", "1", "--serve-param", "num_speculative_tokens=0,3"
    )
    one_line_error(result, "variant 'plain' has no --speculative-config")
