"""Invariance figures: pure rules on hand-made scorings, the real 0.32 wire format, and the simulator
with and without its batch-variance fault."""

from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path

import pytest
from simkit import itlaudit, sim_server

from itlaudit.analysis.invariance import (
    PromptObservations,
    decision,
    max_abs_delta,
    parse_top_logprobs,
    prompt_figures,
    set_difference,
    summarize,
)
from itlaudit.capture.scoring import Scorer, observe
from itlaudit.capture.server_info import server_identity
from itlaudit.errors import ServerRejectedError
from itlaudit.serve.sim import SIM_VERSION, SimConfig, run_sim
from itlaudit.side.client import SideClient

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"
PROMPTS = ["The quick brown fox", "Once upon a time there was"]


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_parse_real_batch2_capture() -> None:
    rows = parse_top_logprobs(_load("completions-k0-logprobs-batch2.json"))
    assert len(rows) == 2 and len(rows[0]) == 1
    assert len(rows[0][0]) == 20
    assert rows[0][0][54] == pytest.approx(-5.561534881591797)
    assert rows[0] == rows[1]  # the real CPU server: both rows of one step bitwise equal


def test_parse_rejects_string_keyed_candidates() -> None:
    with pytest.raises(ServerRejectedError, match="return_tokens_as_token_ids"):
        parse_top_logprobs(_load("completions-k0-logprobs-no-ids.json"))


def test_parse_rejects_missing_logprobs() -> None:
    with pytest.raises(ServerRejectedError, match="no logprobs"):
        parse_top_logprobs({"choices": [{"index": 0, "text": "x", "logprobs": None}]})


def test_delta_only_over_shared_ids_and_set_difference() -> None:
    a = {1: -1.0, 2: -2.0, 3: -3.0}
    b = {1: -1.25, 2: -2.0, 4: -9.0}
    assert max_abs_delta(a, b) == pytest.approx(0.25)
    assert set_difference(a, b) == 2
    assert max_abs_delta(a, {9: 0.0}) == 0.0


def test_decision_is_argmax_over_choices_present() -> None:
    top = {10: -1.0, 11: -0.5, 12: -3.0}
    assert decision(top, [10, 12]) == 10
    assert decision(top, None) == 11
    assert decision(top, [99]) is None


def test_prompt_figures_count_identical_batches_and_flips() -> None:
    alone = {1: -1.0, 2: -1.1}
    moved = {1: -1.2, 2: -1.1}  # token 2 now wins
    obs = PromptObservations(
        prompt="p",
        alone=[alone, dict(alone)],
        batch2=[[alone, alone], [moved, moved], [alone, moved]],
        sweep={1: [alone], 2: [alone, alone], 4: [moved] * 4},
    )
    fig = prompt_figures(obs)
    assert fig.alone_repeat == 0.0 and fig.alone_identical == 2
    assert fig.batch2.vs_alone == pytest.approx(0.2)
    assert fig.batch2.repeat == pytest.approx(0.2)
    assert fig.batch2.identical_to_alone == 1
    assert fig.batch2.rows_identical == 2
    assert fig.batch2.flipped == 2
    assert fig.sweep is not None and fig.sweep.identical == {1: True, 2: True, 4: False}
    assert not fig.sweep.invariant
    summary = summarize([fig, prompt_figures(PromptObservations("q", [alone], [[alone, alone]]))])
    assert summary["decision_flip_rate"] == 0.5
    assert summary["batch2_identical_to_alone"] == 2 and summary["batch2_batches"] == 4


async def test_sim_logprobs_match_the_real_wire_format() -> None:
    real = _load("completions-k0-logprobs-3tok.json")
    async with run_sim(SimConfig()) as url, SideClient() as client:
        sim = await Scorer(client, url, "sim-tiny", top_k=2).complete("The quick brown fox", 3)
    assert list(sim) == list(real)
    assert list(sim["choices"][0]) == list(real["choices"][0])
    sim_lp, real_lp = sim["choices"][0]["logprobs"], real["choices"][0]["logprobs"]
    assert list(sim_lp) == list(real_lp)
    # Real 0.32 advances text_offset by the rendered "token_id:N" strings, not by the text.
    assert sim_lp["text_offset"] == list(accumulate([0] + [len(t) for t in sim_lp["tokens"][:-1]]))
    assert all(t.startswith("token_id:") for t in sim_lp["tokens"])
    assert [len(top) for top in sim_lp["top_logprobs"]] == [2, 2, 2]
    assert list(sim["usage"]) == list(real["usage"])


async def test_sim_batch_list_is_one_choice_per_prompt() -> None:
    real = _load("completions-k0-logprobs-batch2.json")
    async with run_sim(SimConfig()) as url, SideClient() as client:
        sim = await Scorer(client, url, "sim-tiny").complete(["a b", "a b", "c"], 1)
    assert [c["index"] for c in sim["choices"]] == [0, 1, 2]
    assert [len(c["logprobs"]["top_logprobs"][0]) for c in sim["choices"]] == [20, 20, 20]
    assert sim["usage"]["completion_tokens"] == 3
    assert list(sim["choices"][0]["logprobs"]) == list(real["choices"][0]["logprobs"])


async def _observe_sim(config: SimConfig, repeats: int = 5) -> dict:
    async with run_sim(config) as url, SideClient() as client:
        scorer = Scorer(client, url, "sim-tiny")
        observations = [await observe(scorer, p, repeats, concurrent=True) for p in PROMPTS]
    return summarize([prompt_figures(o) for o in observations])


async def test_clean_sim_every_figure_is_zero() -> None:
    summary = await _observe_sim(SimConfig(ttft_ms=2, step_ms=1))
    assert summary["alone_repeat"] == summary["alone_vs_batch2"] == summary["batch2_repeat"] == 0.0
    assert summary["top_set_diff_alone_vs_batch2"] == 0
    assert summary["batch2_identical_to_alone"] == summary["batch2_batches"] == 10
    assert summary["decision_flip_rate"] == 0.0
    assert summary["concurrent"]["vs_alone"] == 0.0
    assert summary["sweep"]["invariant"] is True


async def test_batch_variance_fault_moves_every_batch_figure() -> None:
    summary = await _observe_sim(SimConfig(ttft_ms=2, step_ms=1, batch_variance=0.2))
    assert summary["alone_repeat"] == 0.0  # alone is still reproducible, as in the seed
    assert 0.0 < summary["alone_vs_batch2"] <= 0.2
    assert summary["top_set_diff_alone_vs_batch2"] > 0
    assert summary["batch2_identical_to_alone"] == 0
    assert summary["batch2_rows_identical"] == 10  # rows of one step agree with each other
    assert summary["decision_flip_rate"] > 0.0
    assert summary["concurrent"]["vs_alone"] > 0.0  # the two requests overlapped in the engine
    assert summary["sweep"]["invariant"] is False
    assert summary["sweep"]["max_delta"][1] == 0.0 < summary["sweep"]["max_delta"][16]


async def test_server_identity_reads_version_and_fingerprint() -> None:
    config = SimConfig()
    async with run_sim(config) as url, SideClient() as client:
        identity = await server_identity(client, url, "sim-tiny")
    assert identity == {"version": SIM_VERSION, "system_fingerprint": config.system_fingerprint}


@pytest.mark.parametrize(("variance", "flagged"), [(0.0, False), (0.2, True)])
def test_invariance_command_reports_the_seed_figures(tmp_path: Path, variance: float, flagged: bool) -> None:
    with sim_server(SimConfig(ttft_ms=1, step_ms=0, batch_variance=variance)) as url:
        result = itlaudit("invariance", "--url", url, "-n", "3", "--prompt", "a b c", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for figure in ("alone_repeat", "alone_vs_batch2", "batch2_repeat", "batches bitwise identical to alone"):
        assert figure in result.stdout
    assert ("NOT batch-invariant" in result.stdout) is flagged
    summary = json.loads((tmp_path / "invariance.json").read_text())["url"]["summary"]
    assert (summary["alone_vs_batch2"] > 0) is flagged
    assert summary["batch2_identical_to_alone"] == (0 if flagged else 3)


def test_invariance_command_bad_input_is_one_line() -> None:
    result = itlaudit("invariance", "--url", "http://127.0.0.1:9", "--sweep", "1,x")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--sweep" in result.stderr
    result = itlaudit("invariance")
    assert result.returncode == 2 and "SCENARIO" in result.stderr and "Traceback" not in result.stderr
