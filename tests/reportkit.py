"""Hand-built runs for the report, plot, diff and export tests: streams whose figures are known."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.derive import derive_requests, summarize_run
from itlaudit.analysis.metrics import SUMMARY_METRICS
from itlaudit.analysis.specdecode import SpecDecodeStats
from itlaudit.analysis.summary import VariantSummary
from itlaudit.model.codes import Finding
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord
from itlaudit.report.plots import VariantView
from itlaudit.report.writer import variant_views


def stream(
    variant: str,
    index: int = 0,
    *,
    tokens: int = 64,
    per_chunk: int = 1,
    step_ms: float = 10.0,
    ttft_ms: float = 40.0,
    max_tokens: int = 64,
    text: str = "ok",
    jitter: float = 0.0,
    seed: int = 0,
) -> RequestRecord:
    """A finished stream: one prefill token, then `per_chunk` tokens every `step_ms`; usage on every
    chunk plus a final usage-only chunk. tokens < max_tokens makes a truncated request."""
    rng = np.random.default_rng(seed * 1000 + index)
    counts = [1]
    while counts[-1] < tokens:
        counts.append(min(tokens, counts[-1] + per_chunk))
    t = ttft_ms + np.concatenate(
        ([0.0], np.cumsum(step_ms * (1 + jitter * rng.standard_normal(len(counts) - 1))))
    )
    chunks = ChunkSeries(
        t_ms=[*t.tolist(), float(t[-1]) + 0.1],
        completion_tokens=[*counts, counts[-1]],
        text_len=[1] * len(counts) + [0],
        has_choice=[True] * len(counts) + [False],
        token_ids=[None] * (len(counts) + 1),
    )
    return RequestRecord(
        request_id=f"{variant}-{index:05d}",
        variant=variant,
        endpoint="completions",
        url="http://127.0.0.1:1/v1/completions",
        model="tiny",
        params=RequestParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True),
        finish_reason="length",
        completion_tokens=tokens,
        done_sentinel=True,
        e2e_ms=float(t[-1]) + 0.2,
        text=text,
        chunks=chunks,
    )


def k0_k3(n: int = 4, *, capped: bool = True) -> list[RequestRecord]:
    """K0 at 10 ms/token; K3 at 13 ms/step with 4 tokens per chunk; K3-capped stopping at 16 of 64."""
    records = [stream("K0", i) for i in range(n)]
    records += [stream("K3", i, per_chunk=4, step_ms=13.0) for i in range(n)]
    if capped:
        records += [stream("K3-capped", i, per_chunk=4, step_ms=13.0, tokens=16) for i in range(n)]
    return records


def spec_decode(per_position: list[float], drafts: float = 10.0) -> dict[str, Any]:
    """compare.json's spec-decode figures of a variant whose drafts were accepted at these rates by
    position (vLLM's definitions: acceptance length 1 + accepted / drafts)."""
    accepted = drafts * sum(per_position)
    draft_tokens = drafts * len(per_position)
    return SpecDecodeStats(
        drafts, draft_tokens, accepted, None, accepted / draft_tokens, 1 + accepted / drafts, per_position
    ).to_json()


def request_findings(records: list[RequestRecord]) -> list[Finding]:
    """Every request's findings, as the derivation hands them to the report."""
    return [f for request in derive_requests(records) for f in request.findings]


def views(records: list[RequestRecord], spec: dict[str, dict] | None = None) -> list[VariantView]:
    """The views write_reports would draw: spec-decode figures as compare.json holds them, and the
    truncated requests from the records' own findings."""
    rows = {name: {"spec_decode": figures} for name, figures in (spec or {}).items()}
    compare = CompareResult.from_json({"baseline": None, "variants": rows, "findings": []})
    telemetry = {"server": {r.variant: sampled_window() for r in records}}
    return variant_views(records, summarize_run(records), compare, request_findings(records), telemetry)


# A summary block with nothing measured: block() overrides the figures a test names.
_EMPTY_BLOCK: dict[str, Any] = {
    **{key: {} for key in ("token_source", "tokens_per_chunk_hist", "benchmark", "stamp", "findings")},
    **{key: {} for key in ("schedule_lag_ms", *SUMMARY_METRICS)},
    "requests": 0,
    "errors": 0,
    "model": None,
    "client_loop_lag_ms": {"worst_p99": None, "max": None},
}


def block(**figures: Any) -> VariantSummary:
    """A variant's summary block holding only what a test names (e.g. itl_ms={"p50": 2.0})."""
    return msgspec.convert({**_EMPTY_BLOCK, **figures}, VariantSummary)


def sampled_window(seconds: int = 3) -> list[dict]:
    """server_metrics.jsonl rows of a variant's window, one a second: 2 running, 1 waiting, KV usage
    rising, K=3 drafts accepted 90/80/70 % by position (the server timeline's panels)."""
    drafts = "vllm:spec_decode_num_drafts_total"
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=%d}"
    return [
        {
            "t_ns": t * 1_000_000_000,
            "gauges": {
                "vllm:num_requests_running": 2.0,
                "vllm:num_requests_waiting": 1.0,
                "vllm:kv_cache_usage_perc": 0.1 * (t + 1),
            },
            "counters": {drafts: 10.0 * t, **{per_pos % p: 10.0 * t * (0.9 - 0.1 * p) for p in range(3)}},
            "histograms": {},
        }
        for t in range(seconds)
    ]
