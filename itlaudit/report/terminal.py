"""The end-of-run block in the terminal, one per variant, laid out as vllm bench serve's "Serving
Benchmark Result" (same labels, same order, 40-column labels) so a vllm bench user finds each figure
where they expect it, plus what vllm bench cannot show: the token-true ITL beside its per-chunk ITL,
the tokens per decode chunk, the server build (a simulator says so), the findings, and a variant that
may not be compared marked by the validity rule before any of its figures.

Plain lines: the caller prints them without wrapping (a CI log or a narrow terminal must not break
a label from its value), and integers stay integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from itlaudit.analysis.comparison import VariantComparison
from itlaudit.analysis.summary import Figures, RunSummary, VariantSummary
from itlaudit.analysis.validity import mostly_gibberish, quality_note, variant_validity
from itlaudit.model.block import BlockSettings, percentile_key
from itlaudit.model.codes import CUT_BY_DURATION
from itlaudit.model.meta import Meta
from itlaudit.model.run_context import server_build, variant_meta

WIDTH = 50  # vllm bench's block width; its labels take 40 columns
_NONE = "n/a"

# A line and its style (None: plain): the caller decides how to print both.
Line = tuple[str, str | None]


def _row(label: str, *values: Any, fmt: str = "{:.2f}") -> str:
    """`label` padded to 40 then each value, floats with `fmt`, integers as integers, unknown as n/a."""
    cells = [_NONE if v is None else str(v) if isinstance(v, int | str) else fmt.format(v) for v in values]
    return f"{label:<40} " + " ".join(f"{c:<10}" for c in cells).rstrip()


def _section(title: str) -> str:
    return f"{title:-^{WIDTH}}"


def _statistics(label: str, percentiles: tuple[float, ...], *figures: float | Figures | None) -> list[str]:
    """Mean, Median and a row per chosen percentile for one metric (vllm bench's rows: P99 alone by
    default), one column per figure set (a block["benchmark"] distribution; a figure the run lacks
    is unknown)."""
    sets = [s if isinstance(s, dict) else {} for s in figures]
    rows = [("Mean", "mean"), ("Median", "p50")]
    rows += [(percentile_key(q).upper(), percentile_key(q)) for q in percentiles]
    return [_row(f"{word} {label} (ms):", *(s.get(key) for s in sets)) for word, key in rows]


def _metric_rows(block: BlockSettings, bench: Mapping[str, Any], steps_per_chunk: float | None) -> list[str]:
    """The sections of the metrics --percentile-metrics chose, in vllm bench's order; ITL with the
    per-token column beside vllm bench's per-chunk one, which says how many engine steps a chunk
    carries where the server bundles them (stream_bundled): then it is no step time."""
    per_chunk = "per chunk" if steps_per_chunk is None else f"per chunk of ~{steps_per_chunk:.1f} steps"
    sections = {
        "ttft": [
            _section("Time to First Token"),
            *_statistics("TTFT", block.percentiles, bench.get("ttft_ms")),
            *_answer_rows(block, bench),
        ],
        "tpot": [
            _section("Time per Output Token (excl. 1st token)"),
            *_statistics("TPOT", block.percentiles, bench.get("tpot_ms")),
        ],
        "itl": [
            _section("Inter-token Latency"),
            _row("", per_chunk, "per token"),
            *_statistics("ITL", block.percentiles, bench.get("chunk_itl_ms"), bench.get("token_itl_ms")),
            _row("Tokens per decode chunk:", bench.get("tokens_per_decode_chunk")),
        ],
        "e2el": [
            _section("End-to-end Latency"),
            *_statistics("E2EL", block.percentiles, bench.get("e2el_ms")),
        ],
    }
    return [row for metric in block.metrics for row in sections[metric]]


def _answer_rows(block: BlockSettings, bench: Mapping[str, Any]) -> list[str]:
    """A thinking model's time to first answer (after its reasoning channel), under vllm bench's TTFT,
    which counts the first token of either channel; "n/a" where no reply reached an answer."""
    if "ttfa_ms" not in bench:
        return []
    answered = (bench["ttfa_ms"] or {}).get("count")
    rows = [
        *_statistics("TTFA", block.percentiles, bench["ttfa_ms"]),
        _row("Replies that reached an answer:", answered),
    ]
    if "reasoning_tokens" not in bench:  # a summary from before the channels were counted
        return rows
    rows += [
        _row("Reasoning tokens (server's count):", bench["reasoning_tokens"]),
        _row("Answer tokens:", bench["answer_tokens"]),
    ]
    if bench.get("reasoning_tokens_unknown"):
        rows.append(_row("Thinking replies without a count:", bench["reasoning_tokens_unknown"]))
    for name, label in (("reasoning", "Reasoning"), ("answer", "Answer")):
        figures = bench.get(f"{name}_itl_ms") or {}
        if figures.get("count"):
            rows += _statistics(f"{label} token ITL", block.percentiles, figures)
    return rows


def _cut_rows(block: VariantSummary) -> list[str]:
    """A duration_s run whose grace ran out with streams open: how many it cut (among the failed)."""
    cut = block.findings.get(CUT_BY_DURATION)
    return [_row("Cut at the run's end (duration_s):", cut)] if cut else []


def _sent_rows(bench: Mapping[str, Any]) -> list[str]:
    """The input total above is the server's usage count (as vllm bench prints it); where the client
    knows what it sent (token-id prompts) and the two differ, the sent total is given beside it."""
    sent, counted = bench.get("total_input_tokens_sent"), bench.get("total_input_tokens")
    if sent is None or sent == counted:
        return []
    return [_row("Input tokens sent (the server counted):", sent, counted)]


def _spec_decode_rows(row: VariantComparison | None) -> list[str]:
    """vllm bench 0.32's Speculative Decoding section, from compare's /metrics window (a variant
    whose server drafted), with the stream's acceptance length and accepted tokens beside the
    server's: the server counts drafting steps only, the stream every decode step."""
    spec = row.spec_decode if row is not None else None
    if row is None or spec is None or not spec.num_drafts:
        return []
    rate = spec.acceptance_rate
    rows = [
        _section("Speculative Decoding"),
        _row("", "/metrics", "stream"),
        _row("Acceptance rate (%):", rate * 100 if rate is not None else None),
        _row("Acceptance length:", spec.acceptance_length, row.stream_acceptance_length),
        _row("Drafts:", _count(spec.num_drafts)),
        _row("Draft tokens:", _count(spec.num_draft_tokens)),
        _row("Accepted tokens:", _count(spec.num_accepted_tokens), row.stream_accepted_tokens),
    ]
    per_position = spec.per_position_acceptance
    if per_position:
        rows.append("Per-position acceptance (%):")
        rows += [_row(f"  Position {i}:", rate * 100) for i, rate in enumerate(per_position)]
    return rows


def _energy_rows(server: Mapping[str, Any]) -> list[str]:
    """The watched GPUs' energy over the measured window (analysis.server_metrics.gpu_energy), where
    NVML gave it: vllm bench 0.32 has no such section (its energy PRs, #38647 and #56354, are open)."""
    if not isinstance(server.get("gpu_energy_j"), int | float):
        return []
    return [
        _section("GPU Energy"),
        _row("GPU energy (J):", server["gpu_energy_j"]),
        _row("Energy per output token (J):", server.get("gpu_joules_per_output_token"), fmt="{:.4f}"),
        _row("Output tokens per joule:", server.get("output_tokens_per_joule")),
    ]


def _floor_rows(server: Mapping[str, Any]) -> list[str]:
    """The memory-bandwidth floor (analysis.roofline), where the run named the model's config."""
    if note := server.get("floor_note"):
        return [_section("Bandwidth Floor"), str(note)]
    if not isinstance(server.get("floor_ms"), int | float):
        return []
    share = server.get("floor_share")
    return [
        _section("Bandwidth Floor"),
        _row("Floor per K0 token (ms):", server["floor_ms"], fmt="{:.3f}"),
        _row("Token ITL at the floor (%):", share * 100 if isinstance(share, int | float) else None),
        _row("Bytes per step (GB):", server["floor_bytes_per_step"] / 1e9, fmt="{:.3f}"),
        _row("Memory bandwidth (GB/s):", server.get("floor_bandwidth_gbps"), fmt="{:.0f}"),
    ]


def _count(value: object) -> int | None:
    """A /metrics counter delta (a float on the wire) as the integer vllm bench prints."""
    return int(value) if isinstance(value, int | float) else None


def result_block(
    summary: RunSummary, meta: Meta, variant: str, comparison: VariantComparison | None = None
) -> list[Line]:
    """One variant's block. `meta` is meta.json (the workload and the server's /version);
    `comparison` its compare.json row, for the Speculative Decoding section (compare only)."""
    block = summary.variants[variant]
    bench = block.benchmark
    block_settings = BlockSettings.from_meta(meta)
    workload, info, version = variant_meta(meta, variant)
    lines: list[Line] = [(f"{f' Serving Benchmark Result: {variant} ':=^{WIDTH}}", "bold")]
    validity = variant_validity(summary, variant)
    if not validity.comparable:
        lines.append((f"{variant}: {validity.label}", "bold red"))
    elif (note := quality_note(summary)) and mostly_gibberish(
        {"requests": block.requests, "findings": block.findings}
    ):
        lines.append((f"{variant}: {note}", "yellow"))
    plain = [
        _row("Server:", f"{info.url or _NONE}, {server_build(version)}"),
        _row("Successful requests:", bench.get("completed")),
        _row("Failed requests:", bench.get("failed")),
        *_cut_rows(block),
        _row("Maximum request concurrency:", workload.get("max_concurrency")),
    ]
    if workload.get("request_rate") is not None:
        plain.append(_row("Request rate configured (RPS):", workload["request_rate"]))
    plain += [
        _row("Benchmark duration (s):", bench.get("duration_s")),
        _row("Total input tokens:", bench.get("total_input_tokens")),
        *_sent_rows(bench),
        _row("Total generated tokens:", bench.get("total_output_tokens")),
        _row("Request throughput (req/s):", bench.get("request_throughput")),
        *([_row("Request goodput (req/s):", bench.get("request_goodput"))] if block_settings.goodput else []),
        _row("Output token throughput (tok/s):", bench.get("output_throughput")),
        _row("Peak output token throughput (tok/s):", bench.get("max_output_tokens_per_s")),
        _row("Peak concurrent requests:", bench.get("max_concurrent_requests")),
        _row("Total token throughput (tok/s):", bench.get("total_token_throughput")),
        *_metric_rows(block_settings, bench, comparison.steps_per_chunk if comparison else None),
        *_spec_decode_rows(comparison),
        *_energy_rows(summary.server.get(variant) or {}),
        *_floor_rows(summary.server.get(variant) or {}),
    ]
    lines += [(line, None) for line in plain]
    found = ", ".join(f"{code}×{n}" for code, n in block.findings.items()) or "none"
    lines += [(_row("Findings:", found), "red" if block.findings else None), ("=" * WIDTH, "bold")]
    return lines
