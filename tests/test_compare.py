"""/metrics parsing, acceptance deltas and the K0-vs-K3 comparison, on real capture text."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlaudit.analysis.comparison import (
    ACCEPTANCE_LENGTH_MISMATCH,
    VariantComparison,
    acceptance_reading,
    build_comparison,
    stream_acceptance_length,
)
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.specdecode import (
    CounterSnapshot,
    SpecDecodeStats,
    parse_counters,
    spec_decode_delta,
    step_token_limit,
)
from itlaudit.errors import ItlauditError
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_real_k3_metrics_and_delta_from_zero() -> None:
    after = parse_counters((FIXTURES / "vllm-0.32.0-cpu" / "metrics-k3.txt").read_text())
    stats = spec_decode_delta(CounterSnapshot(), after)
    assert stats is not None
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (13.0, 39.0, 39.0)
    assert stats.acceptance_rate == 1.0
    assert stats.acceptance_length == 4.0
    assert stats.per_position_acceptance == [1.0, 1.0, 1.0]


def test_delta_subtracts_before_and_sums_engines() -> None:
    def text(drafts: int, accepted: int, pos0: int) -> str:
        lines = []
        for engine in ("0", "1"):
            labels = f'engine="{engine}",model_name="m"'
            lines += [
                f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
                f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafts * 3}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} {pos0}',
            ]
        return "\n".join(lines) + "\n"

    stats = spec_decode_delta(parse_counters(text(10, 5, 4)), parse_counters(text(30, 25, 14)))
    assert stats is not None
    # 2 engines × (30-10) drafts = 40; accepted 2 × 20 = 40; draft tokens 2 × 60 = 120
    assert (stats.num_drafts, stats.num_accepted_tokens, stats.num_draft_tokens) == (40.0, 40.0, 120.0)
    assert stats.acceptance_length == pytest.approx(2.0)
    assert stats.acceptance_rate == pytest.approx(1 / 3)
    assert stats.per_position_acceptance == [pytest.approx(0.5)]


def test_no_spec_counters_means_none() -> None:
    k0 = parse_counters((FIXTURES / "vllm-0.32.0-cpu" / "metrics-k0.txt").read_text())
    assert spec_decode_delta(k0, k0) is None


def test_garbage_metrics_is_one_line_error() -> None:
    with pytest.raises(ItlauditError, match="not Prometheus text"):
        parse_counters("vllm:spec_decode_num_drafts_total{engine= 3\n")


def _record(variant: str, counts: list[int]) -> RequestRecord:
    n = len(counts)
    return RequestRecord(
        request_id=f"{variant}-00000",
        variant=variant,
        endpoint="completions",
        url="u",
        model="m",
        params=RequestParams(max_tokens=counts[-1]),
        finish_reason="length",
        completion_tokens=counts[-1],
        done_sentinel=True,
        e2e_ms=10.0 * n + 5,
        chunks=ChunkSeries(
            t_ms=[10.0 * (i + 1) for i in range(n)],
            completion_tokens=counts,
            text_len=[1] * n,
            has_choice=[True] * n,
            token_ids=[None] * n,
        ),
    )


def _stats(acceptance_length: float) -> object:
    drafts = 10.0
    accepted = (acceptance_length - 1) * drafts
    before = CounterSnapshot(totals={"vllm:spec_decode_num_drafts_total": 0.0})
    after = CounterSnapshot(
        totals={
            "vllm:spec_decode_num_drafts_total": drafts,
            "vllm:spec_decode_num_draft_tokens_total": drafts * 3,
            "vllm:spec_decode_num_accepted_tokens_total": accepted,
        }
    )
    return spec_decode_delta(before, after)


def test_stream_acceptance_length_excludes_prefill_chunk() -> None:
    assert stream_acceptance_length([_record("K3", [1, 5, 9, 13])]) == 4.0


def test_comparison_speedups_and_quiet_cross_check() -> None:
    records = [_record("K0", list(range(1, 14))), _record("K3", [1, 5, 9, 13])]
    comparison = build_comparison(
        summarize_run(records, ["K0", "K3"]), records, {"K0": None, "K3": _stats(4.0)}
    )
    k3 = comparison.variants["K3"]
    # K0: 12 tokens over 120 ms → 10 ms; K3: 12 tokens over 30 ms → 2.5 ms
    assert k3.speedup_token_itl == pytest.approx(4.0)
    assert k3.speedup_chunk_itl == pytest.approx(1.0)  # both 10 ms per chunk
    assert k3.spec_decode is not None and k3.spec_decode.acceptance_length == 4.0
    assert comparison.findings == []


def test_acceptance_length_mismatch_fires_past_tolerance() -> None:
    records = [_record("K0", list(range(1, 14))), _record("K3", [1, 5, 9, 13])]
    comparison = build_comparison(summarize_run(records, ["K0", "K3"]), records, {"K3": _stats(2.0)})
    (finding,) = comparison.findings
    assert finding["code"] == ACCEPTANCE_LENGTH_MISMATCH
    assert finding["evidence"]["stream"] == 4.0 and finding["evidence"]["metrics"] == 2.0
    # one conclusion, from the counts: more drafting steps than the stream had is other traffic
    assert finding["message"].endswith(
        "Conclusion: /metrics counts 10 drafting steps against the stream's 3 decode steps, so other "
        "requests reached the server in the window."
    )
    single = [_record("K0", list(range(1, 14))), _record("K3", list(range(1, 14)))]
    (lost,) = build_comparison(summarize_run(single, ["K0", "K3"]), single, {"K3": _stats(4.0)}).findings
    assert lost["message"].endswith(
        "Conclusion: the server's accepted drafts did not reach this stream as tokens: chunks were lost."
    )


def test_chunks_of_more_tokens_than_a_step_makes_are_named_bundled_and_step_sized_ones_are_not() -> None:
    """step_token_limit: K+1 from the drafts, 1 for a vLLM that generated and drafted nothing, unknown
    otherwise. K0 chunks of 4 tokens and K3 chunks of 8 (two steps a chunk) are stream_bundled, and the
    K3 stream's 8 tokens a chunk against /metrics' 4 is that, not an acceptance_length_mismatch; chunks
    of a step's size are quiet, and nothing is said where /metrics cannot give the limit."""
    generated = CounterSnapshot(totals={"vllm:generation_tokens_total": 50.0})
    assert step_token_limit(CounterSnapshot(), generated) == 1
    assert step_token_limit(CounterSnapshot(), CounterSnapshot()) is None
    before = CounterSnapshot(totals={"vllm:spec_decode_num_drafts_total": 0.0})
    after = CounterSnapshot(
        totals={"vllm:spec_decode_num_drafts_total": 10.0, "vllm:spec_decode_num_draft_tokens_total": 30.0}
    )
    assert step_token_limit(before, after) == 4
    bundled = [_record("K0", [1, 5, 9, 13, 17]), _record("K3", [1, 9, 17, 25, 33])]
    summary = summarize_run(bundled, ["K0", "K3"])
    found = build_comparison(summary, bundled, {"K0": None, "K3": _stats(4.0)}, {"K0": 1, "K3": 4}).findings
    assert [(f["code"], f["evidence"]["variant"]) for f in found] == [
        ("stream_bundled", "K0"),
        ("stream_bundled", "K3"),
    ]
    assert [f["evidence"]["steps_per_chunk"] for f in found] == [4.0, 2.0]
    assert build_comparison(summary, bundled, {"K0": None, "K3": _stats(4.0)}).findings[0]["code"] == (
        ACCEPTANCE_LENGTH_MISMATCH  # no limit known: the bundling cannot be told, the mismatch stands
    )
    stepwise = [_record("K0", list(range(1, 14))), _record("K3", [1, 5, 9, 13])]
    quiet = build_comparison(
        summarize_run(stepwise, ["K0", "K3"]), stepwise, {"K3": _stats(4.0)}, {"K0": 1, "K3": 4}
    )
    assert quiet.findings == []


def test_an_ngram_drafter_that_skips_steps_is_explained_not_left_standing() -> None:
    """vLLM 0.24.0 on an H200, ngram K=3: the stream carried 4088 tokens in 1484 decode chunks (2.75 per
    chunk), /metrics 2612 accepted over 1000 drafting steps (3.61): the server divides by the steps
    that drafted, and the two agree on the accepted tokens. Agreeing figures, or accepted tokens that
    disagree too, get no reading (the latter is acceptance_length_mismatch's)."""

    def row(server_al: float, server_accepted: float) -> VariantComparison:
        spec = SpecDecodeStats(1000, 3000, server_accepted, None, None, server_al, [])
        return VariantComparison(
            stream_acceptance_length=4088 / 1484, stream_accepted_tokens=4088 - 1484, spec_decode=spec
        )

    assert acceptance_reading(row(3.612, 2612)) == (
        "the server drafted on 1000 of 1484 decode steps: its acceptance length counts those only, the "
        "stream's every step; both count 2604 vs 2612 accepted tokens"
    )
    assert acceptance_reading(row(2.8, 2612)) is None
    assert acceptance_reading(row(3.612, 4000)) is None


def _greedy_record(variant: str, ids: list[int]) -> RequestRecord:
    record = _record(variant, list(range(1, len(ids) + 1)))
    record.params.temperature = 0.0
    record.chunks.token_ids = [[tok] for tok in ids]
    return record


def test_compare_reports_lossless_mismatch_at_first_differing_token() -> None:
    records = [_greedy_record("K0", [5, 6, 7, 8, 9]), _greedy_record("K3", [5, 6, 7, 1, 9])]
    comparison = build_comparison(summarize_run(records, ["K0", "K3"]), records, {})
    (finding,) = [f for f in comparison.findings if f["code"] == "spec_decode_output_mismatch"]
    assert (
        finding["evidence"]["position"],
        finding["evidence"]["base_value"],
        finding["evidence"]["spec_value"],
    ) == (
        3,
        8,
        1,
    )


def test_compare_quiet_when_greedy_outputs_match() -> None:
    records = [_greedy_record("K0", [5, 6, 7, 8, 9]), _greedy_record("K3", [5, 6, 7, 8, 9])]
    assert build_comparison(summarize_run(records, ["K0", "K3"]), records, {}).findings == []
