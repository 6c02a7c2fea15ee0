"""A variant's run-level figures as vllm bench serve reports them: requests, duration, token totals,
throughputs, and TTFT/TPOT/ITL/E2EL statistics, beside the token-true ITL that vllm bench does not have.

vllm bench's definitions are kept exactly (calculate_metrics in vllm/benchmarks/serve.py), so the
"Serving Benchmark Result" block and a --save-result JSON read the same to a vllm bench user:

- Only successful requests count in the token totals and latency statistics; failed ones are counted.
- TTFT, TPOT and E2EL are one value per request; TPOT is (E2EL − TTFT) / (output tokens − 1) over
  requests with more than one output token.
- vllm bench's ITL pools every chunk gap of every request: one value per chunk, so under speculative
  decoding it is per chunk, not per token (`chunk_itl_ms` here). The token ITL (`token_itl_ms`)
  pools the same gaps divided by the tokens each chunk delivered, weighted by those tokens: the
  per-token latency a user feels, pooled the way vllm bench pools.
- Percentiles interpolate linearly, as np.percentile does; std is the population std, as np.std.

The duration runs from the first send to the last end of the variant's measured requests (warmups
are never records here), summed over --append rounds, which share no clock zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from itlaudit.analysis.metrics import (
    RequestMetrics,
    channel_gaps,
    decode_gaps,
    distribution,
    ratio,
    token_counts,
)
from itlaudit.model.block import BlockSettings
from itlaudit.model.records import RequestRecord, Status


def request_span_ms(record: RequestRecord) -> tuple[float, float] | None:
    """(send, end) in ms from the variant's start, or None for a record without a dispatch offset (an
    import, an older itlaudit). A request that ended without e2e_ms ends at its last chunk."""
    if record.sent_offset_ms is None:
        return None
    t_ms = record.chunks.t_ms
    length = record.e2e_ms if record.e2e_ms is not None else (max(t_ms) if t_ms else 0.0)
    return record.sent_offset_ms, record.sent_offset_ms + length


def _round(record: RequestRecord) -> str:
    """The --append round a request belongs to: ids are `<variant>-<n>`, or `<variant>.<tag>-<n>`."""
    return record.request_id.removeprefix(record.variant).rpartition("-")[0]


def _duration_s(records: Sequence[RequestRecord]) -> float | None:
    """First send to last end, per round (each round's offsets have their own zero), summed."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        span = request_span_ms(record)
        if span is None:
            return None
        spans.setdefault(_round(record), []).append(span)
    if not spans:
        return None
    total_ms = sum(max(end for _, end in s) - min(start for start, _ in s) for s in spans.values())
    return total_ms / 1000.0


def _peaks(records: Sequence[RequestRecord]) -> tuple[float | None, int | None]:
    """vllm bench's max_output_tokens_per_s and max_concurrent_requests: over one-second buckets from
    the first send, the most content chunks that arrived (vllm bench counts the first token and one
    per chunk gap: chunks, whatever the key says) and the most requests open in one bucket. None for
    records without dispatch offsets, or spread over several --append rounds (no shared clock)."""
    spans = [request_span_ms(r) for r in records]
    known = [s for s in spans if s is not None]
    if not known or len(known) < len(spans) or len({_round(r) for r in records}) > 1:
        return None, None
    start = min(send for send, _ in known)
    buckets = math.ceil((max(end for _, end in known) - start) / 1000.0) + 1
    chunks = np.zeros(buckets)
    open_requests = np.zeros(buckets)
    for record, (send, end) in zip(records, known, strict=True):
        arrivals, _, _ = token_counts(record)
        seconds = ((send + arrivals - start) // 1000).astype(np.int64)
        np.add.at(chunks, seconds[(seconds >= 0) & (seconds < buckets)], 1)
        open_requests[int((send - start) // 1000) : int((end - start) // 1000) + 1] += 1
    return float(chunks.max()), int(open_requests.max())


def _sent_total(records: Sequence[RequestRecord]) -> int | None:
    sent = [r.sent_prompt_tokens for r in records]
    return sum(t for t in sent if t is not None) if sent and None not in sent else None


def meets_slo(figures: Mapping[str, float | None], slo: Mapping[str, float]) -> bool:
    """vllm bench's good request (calculate_metrics): each figure the SLO names at or under its limit,
    a figure the request cannot have (the TPOT of a one-token reply) counted as 0, as vllm bench
    counts it."""
    return all((figures.get(key) or 0.0) <= limit for key, limit in slo.items())


def _goodput(
    ok: Sequence[RequestMetrics], slo: Mapping[str, float], duration_s: float | None
) -> float | None:
    """vllm bench's request_goodput: completed requests that met every SLO, per second."""
    good = sum(
        1 for m in ok if meets_slo({"ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms, "e2e_ms": m.e2e_ms}, slo)
    )
    return ratio(good, duration_s)


def _channel_figures(
    ok: Sequence[tuple[RequestRecord, RequestMetrics]], extra: Sequence[float]
) -> dict[str, Any]:
    """A thinking model's figures beside vllm bench's (which count both channels as one): TTFA, the
    reasoning and answer token totals (the server's count; replies it gave none for are counted
    apart, never guessed), and each channel's token ITL pooled as token_itl_ms is."""
    counted = [m for r, m in ok if r.reasoning and m.reasoning_tokens is not None]
    figures: dict[str, Any] = {
        "ttfa_ms": distribution([m.ttfa_ms for _, m in ok], extra=extra),
        "reasoning_tokens": sum(m.reasoning_tokens or 0 for m in counted),
        "answer_tokens": sum(m.answer_tokens or 0 for m in counted),
        "reasoning_tokens_unknown": sum(1 for r, m in ok if r.reasoning and m.reasoning_tokens is None),
    }
    for name in ("reasoning", "answer"):
        pairs = [channel_gaps(r)[name] for r, _ in ok if r.reasoning]
        gaps = np.concatenate([g for g, _ in pairs]) if pairs else np.zeros(0)
        tokens = np.concatenate([k for _, k in pairs]) if pairs else np.zeros(0, dtype=np.int64)
        kept = tokens > 0
        figures[f"{name}_itl_ms"] = distribution(gaps[kept] / tokens[kept], tokens[kept], extra=extra)
    return figures


def benchmark_figures(
    records: Sequence[RequestRecord], metrics: Sequence[RequestMetrics], block: BlockSettings | None = None
) -> dict[str, float | int | dict[str, float | int | None] | None]:
    """summary.json's block["benchmark"] for one variant's measured records and their metrics;
    `block` (meta.json's choice) adds request_goodput and the percentiles beyond p50/p90/p99."""
    block = block or BlockSettings()
    extra = [q for q in block.percentiles if q not in (50, 90, 99)]
    ok = [(r, m) for r, m in zip(records, metrics, strict=True) if r.status == Status.OK]
    ok_records = [r for r, _ in ok]
    duration_s = _duration_s(records)
    input_tokens = [r.prompt_tokens for r in ok_records]
    total_input = sum(t for t in input_tokens if t is not None)
    total_output = sum(m.completion_tokens or 0 for _, m in ok)
    gaps = [decode_gaps(r) for r in ok_records]
    chunk_gaps = np.concatenate([g for g, _ in gaps]) if gaps else np.zeros(0)
    increments = np.concatenate([k for _, k in gaps]) if gaps else np.zeros(0, dtype=np.int64)
    positive = increments > 0
    peak_chunks, peak_open = _peaks(ok_records)
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": int(total_input),
        "input_tokens_unknown": sum(1 for t in input_tokens if t is None),
        # The prompts' token count as sent, where every one is known (token-id prompts): beside the
        # server's count, which vllm bench 0.32 prints too, so a server that truncated says so. Absent
        # otherwise, so a summary of text prompts reads as it did.
        **({"total_input_tokens_sent": sent} if (sent := _sent_total(ok_records)) is not None else {}),
        "total_output_tokens": int(total_output),
        "request_throughput": ratio(len(ok), duration_s),
        "output_throughput": ratio(total_output, duration_s),
        "total_token_throughput": ratio(total_input + total_output, duration_s),
        "max_output_tokens_per_s": peak_chunks,
        "max_concurrent_requests": peak_open,
        # vllm bench's --goodput: absent without SLOs, as summary.json was before them
        **(
            {"request_goodput": _goodput([m for _, m in ok], block.goodput, duration_s)}
            if block.goodput
            else {}
        ),
        "ttft_ms": distribution([m.ttft_ms for _, m in ok], extra=extra),
        # a thinking model's time to first answer, beside vllm bench's TTFT (the first token of either
        # channel); absent where no reply had a reasoning channel, so other summaries read as before
        **(_channel_figures(ok, extra) if any(r.reasoning for r in ok_records) else {}),
        "tpot_ms": distribution([m.tpot_ms for _, m in ok], extra=extra),
        "e2el_ms": distribution([m.e2e_ms for _, m in ok], extra=extra),
        "chunk_itl_ms": distribution(chunk_gaps, extra=extra),
        "token_itl_ms": distribution(
            chunk_gaps[positive] / increments[positive], increments[positive], extra=extra
        ),
        "decode_chunks": int(chunk_gaps.size),
        "tokens_per_decode_chunk": ratio(float(increments.sum()), float(chunk_gaps.size)),
    }
