"""The four findings that fired wrongly on real CUDA vLLM (0.24.0, H200), replayed from the captured run
folders in tests/fixtures/vllm-0.24.0-cuda-h200-runs (copied from the shared captures; see their
README for the servers). Each fix has a test that keeps the capture quiet (or at warning) and one that
makes the finding fire."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from itlaudit.analysis.comparison import (
    ACCEPTANCE_LENGTH_MISMATCH,
    build_comparison,
    stream_acceptance_length,
    stream_accepted_tokens,
)
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.findings import Finding, request_findings, run_findings
from itlaudit.analysis.lossless import with_execution_modes
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.specdecode import CounterSnapshot, spec_decode_delta
from itlaudit.model.codes import Severity
from itlaudit.model.records import ChunkSeries, RequestRecord
from itlaudit.store.jsonl import load_records

CAPTURES = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda-h200-runs"


def _meta(run: str) -> dict:
    return json.loads((CAPTURES / run / "meta.json").read_text())


def _window(run: str, variant: str):
    info = _meta(run)["variants"][variant]
    return spec_decode_delta(
        CounterSnapshot.from_json(info["before"]), CounterSnapshot.from_json(info["after"])
    )


# --- ngram: acceptance length drifts, accepted tokens agree ----------------------------------------


def _partial() -> tuple[list[RequestRecord], dict]:
    records = load_records(CAPTURES / "partial-c1" / "requests.jsonl")
    stats = {name: _window("partial-c1", name) for name in ("K0", "NG", "K3N")}
    return records, stats


def test_ngram_acceptance_is_cross_checked_on_accepted_tokens() -> None:
    records, stats = _partial()
    ngram = [r for r in records if r.variant == "NG"]
    assert stream_acceptance_length(ngram) == pytest.approx(2.755, abs=1e-3)
    assert stats["NG"].acceptance_length == pytest.approx(3.086, abs=1e-3)  # 11% apart: the old alarm
    assert stream_accepted_tokens(ngram) == 4088 - 1484 == 2604
    assert stats["NG"].num_accepted_tokens == 2612
    comparison = build_comparison(summarize_run(records, ["K0", "NG", "K3N"]), records, stats)
    assert [f for f in comparison.findings if f["code"] == ACCEPTANCE_LENGTH_MISMATCH] == []
    assert comparison.variants["NG"].stream_accepted_tokens == 2604


def _merge_pairs(record: RequestRecord) -> RequestRecord:
    """Every two decode chunks delivered as one: what a proxy that buffers the stream does."""
    c = record.chunks
    keep = [0, *range(2, len(c.t_ms), 2)]
    if keep[-1] != len(c.t_ms) - 1:
        keep.append(len(c.t_ms) - 1)
    pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
    chunks = ChunkSeries(
        pick(c.t_ms), pick(c.completion_tokens), pick(c.text_len), pick(c.has_choice), pick(c.token_ids)
    )
    return replace(record, chunks=chunks)


def test_merged_chunks_still_raise_the_mismatch_on_the_ngram_capture() -> None:
    records, stats = _partial()
    merged = [_merge_pairs(r) if r.variant == "NG" else r for r in records]
    comparison = build_comparison(summarize_run(merged, ["K0", "NG", "K3N"]), merged, stats)
    (found,) = [f for f in comparison.findings if f["code"] == ACCEPTANCE_LENGTH_MISMATCH]
    assert found["evidence"]["variant"] == "NG"
    assert found["evidence"]["accepted_gap"] > 0.1


def test_foreign_traffic_in_the_window_raises_the_mismatch() -> None:
    """Another client's drafts in the /metrics window: more drafting steps than the stream had."""
    records, stats = _partial()
    ngram = [r for r in records if r.variant == "NG"]
    doubled = replace(
        stats["NG"],
        num_drafts=stats["NG"].num_drafts * 2,
        acceptance_length=1 + stats["NG"].num_accepted_tokens / (stats["NG"].num_drafts * 2),
    )
    comparison = build_comparison(summarize_run(ngram, ["NG"]), ngram, {"NG": doubled})
    assert [f["code"] for f in comparison.findings] == [ACCEPTANCE_LENGTH_MISMATCH]


# --- max_tokens omitted on /v1/completions: vLLM's default of 16 ------------------------------------


def test_stop_at_16_without_max_tokens_names_the_completions_default() -> None:
    records = load_records(CAPTURES / "cap-omitted-cmpl" / "requests.jsonl")
    assert {(r.params.max_tokens, r.completion_tokens, r.endpoint) for r in records} == {
        (None, 16, "completions")
    }
    for record in records:
        (truncated,) = [f for f in request_findings(record, request_metrics(record))]
        assert "vLLM's default max_tokens for /v1/completions" in truncated.message
        assert "generation_config" not in truncated.message
        assert truncated.evidence["completions_default"] is True
    (cap,) = run_findings(records)
    assert "default max_tokens" in cap.message and "server-side cap" not in cap.message


def test_a_generation_config_cap_is_still_blamed_when_the_stop_is_not_the_default() -> None:
    records = load_records(CAPTURES / "cap-omitted-cmpl" / "requests.jsonl")
    at_128 = [replace(r, completion_tokens=128) for r in records]
    (found,) = request_findings(at_128[0], request_metrics(at_128[0]))
    assert "generation_config max_new_tokens" in found.message
    assert found.evidence["completions_default"] is False
    chat = replace(records[0], endpoint="chat")  # chat has no default of 16
    (found,) = request_findings(chat, request_metrics(chat))
    assert "generation_config max_new_tokens" in found.message
    assert "server-side cap" in run_findings(at_128)[0].message


# --- eager vs CUDA graphs: near ties are a warning --------------------------------------------------


def _cudagraph_findings() -> list[Finding]:
    compared = json.loads((CAPTURES / "c1-cudagraph" / "compare.json").read_text())
    return [Finding.from_json(f) for f in compared["findings"] if f["code"] == "spec_decode_output_mismatch"]


def test_near_tie_between_eager_and_cuda_graphs_is_a_warning() -> None:
    findings = _cudagraph_findings()
    assert len(findings) == 8 and all(f.severity == Severity.ERROR for f in findings)  # as captured
    assert max(f.evidence["base_top2_margin"] for f in findings) < 0.004
    judged = [with_execution_modes(f, "eager", "compiled") for f in findings]
    assert {f.severity for f in judged} == {Severity.WARNING}
    assert all(
        f.message.endswith(
            f"Conclusion: numerics differ between execution modes (eager vs compiled) at a near tie "
            f"(margin {f.evidence['base_top2_margin']:.3g} nats): warning."
        )
        for f in judged
    )


def test_clear_margin_or_same_mode_or_unknown_mode_keeps_the_error() -> None:
    near = _cudagraph_findings()[0]
    clear = replace(near, evidence={**near.evidence, "base_top2_margin": 3.0, "near_tie": False})
    assert with_execution_modes(clear, "eager", "compiled").severity == Severity.ERROR
    assert with_execution_modes(near, "eager", "eager").severity == Severity.ERROR
    assert with_execution_modes(near, None, "compiled").severity == Severity.ERROR


def test_execution_modes_without_speculation_are_never_judged_as_spec_decode() -> None:
    """G0 eager vs G0 with CUDA graphs (no drafts on either side): even a clear margin is the two
    execution paths' numerics, a warning that says so with the margin."""
    near = _cudagraph_findings()[0]
    clear = replace(near, evidence={**near.evidence, "base_top2_margin": 3.0, "near_tie": False})
    judged = with_execution_modes(clear, "eager", "compiled", speculates=False)
    assert judged.severity == Severity.WARNING
    assert judged.message.endswith(
        "Conclusion: numerics differ between execution modes (eager vs compiled) and neither speculates "
        "(margin 3 nats): warning."
    )


# --- itlaudit's own requests stay outside the /metrics window ---------------------------------------


@pytest.mark.parametrize("run", ["partial-c1", "c1-cudagraph"])
def test_captured_windows_count_exactly_the_workloads_tokens(run: str) -> None:
    """In these captures the identity ping came before `before` (it shows as the 1 generation token
    already counted on a fresh K3 server) and re-scoring after `after`: each window's generation
    tokens are exactly the workload's. The live check of the ordering is
    test_faults_e2e.test_metrics_window_holds_only_the_workload."""
    meta = _meta(run)
    for name, info in meta["variants"].items():
        counted = (
            info["after"]["totals"]["vllm:generation_tokens_total"]
            - info["before"]["totals"]["vllm:generation_tokens_total"]
        )
        assert counted == 8 * 512, name


def test_execution_mode_is_declared_or_read_from_a_launched_servers_arguments(tmp_path: Path) -> None:
    from itlaudit.model.scenario import parse_scenario
    from itlaudit.workflows.compare import execution_mode

    text = (
        'name = "m"\n[workload]\nprompts = ["hi"]\n\n'
        '[[variants]]\nname = "K0"\nurl = "http://a"\nexecution_mode = "eager"\n\n'
        '[[variants]]\nname = "K3"\nurl = "http://b"\n\n'
        '[[variants]]\nname = "L0"\n[variants.launch]\nkind = "python"\npython = "/p"\n'
        'server_args = ["--enforce-eager"]\n\n'
        '[[variants]]\nname = "L3"\n[variants.launch]\nkind = "python"\npython = "/p"\n'
    )
    k0, k3, l0, l3 = parse_scenario(text, tmp_path / "m.toml").variants
    assert execution_mode(k0, overridden=False) == "eager"
    assert execution_mode(k3, overridden=False) is None  # a URL server nobody described
    assert execution_mode(l0, overridden=False) == "eager"
    assert execution_mode(l3, overridden=False) == "compiled"
    assert execution_mode(l3, overridden=True) is None  # --url replaced the launch
