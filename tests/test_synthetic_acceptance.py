"""Speculation as configured (issue 35 item 2): a variant whose acceptance is forced (vLLM's
`rejection_sample_method = "synthetic"`, PRs #38045/#40662/#41035) is measured but never ranked — its
speed is a projection at the forced acceptance — and the lossless and distribution audits say "not
applicable" instead of crying bug; a standard K3 beside it is still judged. On simulated servers
launched by `compare` (vLLM's CPU sampler refuses synthetic acceptance at the first request, so no real
engine here can make the case; its config is parsed from a real `--speculative-config` argument).
CI cost: ~15 s (three launched simulators, 2 requests each)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from faultkit import itlaudit

from itlaudit.analysis.specdecode import speculation_text
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.run_context import synthetic_acceptance

SIM = [sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--ttft-ms", "5", "--step-ms", "4"]
SYNTHETIC = {
    "method": "draft_model", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 2.5,
}  # fmt: skip


def _variant(name: str, *flags: str, declared: str = "") -> str:
    return (
        f'[[variants]]\nname = "{name}"\n{declared}[variants.launch]\nkind = "command"\n'
        f"command = {json.dumps([*SIM, *flags])}\n"
    )


def test_a_forced_acceptance_is_labelled_not_ranked_and_not_audited(tmp_path: Path) -> None:
    """K3S writes other tokens than K0 (another seed) and would be a lossless error and a speedup; as
    declared synthetic it is neither. K3X, the same server undeclared, is still judged: its mismatch
    is reported (the audit stayed on for it)."""
    declared = "speculative_config = " + json.dumps(SYNTHETIC).replace('": ', '" = ') + "\n"
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'name = "synthetic"\nendpoint = "completions"\n[workload]\nprompts = ["hello there"]\n'
        "num_requests = 2\nmax_tokens = 24\nignore_eos = true\ntemperature = 0\n"
        + _variant("K0")
        + _variant("K3S", "--num-speculative-tokens", "3", "--seed", "7", declared=declared)
        + _variant("K3X", "--num-speculative-tokens", "3", "--seed", "7")
    )
    done = itlaudit("compare", str(scenario), "--out", str(tmp_path / "run"), "--no-plots", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    compared = json.loads((tmp_path / "run" / "compare.json").read_text())
    rows = compared["variants"]
    assert rows["K3S"]["not_comparable"].startswith("synthetic acceptance (acceptance length 2.5 forced)")
    assert rows["K3S"]["not_audited"].startswith("not applicable: synthetic acceptance")
    assert rows["K3X"]["not_comparable"] is None and rows["K3X"]["not_audited"] is None
    judged = {(f["code"], f["request_id"].split("-")[0]) for f in compared["findings"]}
    assert ("spec_decode_output_mismatch", "K3X") in judged
    assert not any(variant == "K3S" for code, variant in judged if code == "spec_decode_output_mismatch")
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["variants"]["K3S"]["speculative_config"] == SYNTHETIC
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["synthetic_acceptance"] == {"K3S": "acceptance length 2.5 forced"}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "synthetic acceptance" in report and "projection" in report
    # the context says how each launched server speculates as far as its arguments say: K3S as
    # declared; K0 and K3X (the simulator's own flags, not vLLM's) with no --speculative-config
    assert "**speculation K0**: no --speculative-config in its launch arguments" in report
    assert "**speculation K3S**: draft\\_model, K=3; acceptance forced (synthetic)" in report
    # The simulator accepts every draft whatever it was told: the stream's ~3.8 tokens a decode chunk
    # is not the 2.5 it declares forcing, and the context says so.
    assert "tokens a decode chunk against the 2.5 forced (+" in report
    assert "not the acceptance it was told to force" in report


def test_the_stream_acceptance_is_read_against_the_configured_one() -> None:
    """Near the forced length (the capped last chunk pulls the mean down) it is quiet; a K3 with no
    forcing is read against the K+1 a step can carry. ~0 s."""
    near = speculation_text(SYNTHETIC, 1, measured=2.4)
    assert near.endswith("the stream measured 2.40 tokens a decode chunk against the 2.5 forced")
    standard = {"method": "ngram", "num_speculative_tokens": 3}
    assert speculation_text(standard, 1, measured=3.1).endswith(
        "3.10 tokens a decode chunk, of at most 4 a step at K=3"
    )
    assert "measured" not in speculation_text(standard, 1)


def test_a_dynamic_k_names_the_k_in_force_and_k0_by_schedule_is_not_speculation_off() -> None:
    """vLLM's num_speculative_tokens_per_batch_size (PR #32374): the context line names the schedule
    and the K at the run's concurrency; a K of 0 there is "by the schedule", another baseline than
    speculation off. ~0 s."""
    dynamic = {"method": "mtp", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [
        [1, 4, 3], [5, 16, 1], [17, 1024, 0]]}  # fmt: skip
    assert speculation_text(dynamic, 2).endswith("at this run's concurrency 2: K=3")
    at_64 = speculation_text(dynamic, 64)
    assert "batch 17-1024: K=0" in at_64 and at_64.endswith(
        "K=0 by the schedule (drafting on, not speculation off)"
    )
    assert speculation_text(None, 1) == "no --speculative-config in its launch arguments"
    assert speculation_text({"method": "ngram", "num_speculative_tokens": 3}, None) == "ngram, K=3"


def test_a_launched_servers_speculative_config_is_read_from_its_arguments() -> None:
    """vLLM's `--speculative-config JSON` (or `=JSON`) on a launched server: what the run records and
    judges; a standard method is not synthetic, and a config that is not JSON is none."""
    text = json.dumps(SYNTHETIC)
    spaced = LaunchSpec(kind="command", command=["vllm", "serve", "m", "--speculative-config", text])
    assert spaced.speculative_config == SYNTHETIC
    joined = LaunchSpec(kind="python", python="py", server_args=[f"--speculative-config={text}"])
    assert joined.speculative_config == SYNTHETIC
    assert (
        LaunchSpec(kind="python", python="py", server_args=["--speculative-config", "{"]).speculative_config
        is None
    )
    assert synthetic_acceptance(SYNTHETIC) == "acceptance length 2.5 forced"
    assert synthetic_acceptance({**SYNTHETIC, "rejection_sample_method": "standard"}) is None
    rates = {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.8]}
    assert synthetic_acceptance(rates) == "acceptance rates 0.9, 0.8 forced"
