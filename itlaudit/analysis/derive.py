"""Pure assembly of a run's derived figures: per-request lines and per-variant summaries.

Everything here is recomputable from requests.jsonl alone, which is what lets `itlaudit report`
re-derive a run's results with a newer itlaudit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, NamedTuple

import msgspec

from itlaudit.analysis.benchmark import benchmark_figures
from itlaudit.analysis.findings import request_findings, run_findings
from itlaudit.analysis.metrics import (
    RequestMetrics,
    request_metrics,
    summarize,
    tokens_per_chunk_hist,
    variant_summary,
)
from itlaudit.analysis.quality import text_quality
from itlaudit.analysis.request_acceptance import server_acceptance
from itlaudit.analysis.roofline import launch_bound_finding
from itlaudit.analysis.summary import Figures, LoopLag, RunSummary, VariantSummary
from itlaudit.model.block import BlockSettings
from itlaudit.model.codes import REGISTRY, Finding, Scope
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.run_context import QualitySettings


class RequestDerivation(NamedTuple):
    """One request's figures and findings, computed once for derived.jsonl and the summary alike."""

    record: RequestRecord
    metrics: RequestMetrics
    findings: list[Finding]


def derive_requests(records: Sequence[RequestRecord]) -> list[RequestDerivation]:
    """Each record's metrics and findings, in the records' order."""
    derived = []
    for record in records:
        metrics = request_metrics(record)
        derived.append(RequestDerivation(record, metrics, request_findings(record, metrics)))
    return derived


_METRIC_FIELDS = tuple(f.name for f in fields(RequestMetrics))


def request_line(request: RequestDerivation) -> JSONObject:
    """derived.jsonl's line: metrics, text quality and findings, keyed by request_id and variant.
    requests.jsonl holds only the raw record; this is what derived.jsonl, requests.csv and every
    reader of per-request figures (diff, bisect, smoke, report) use."""
    record = request.record
    line: JSONObject = {"request_id": record.request_id, "variant": record.variant}
    derived = {name: getattr(request.metrics, name) for name in _METRIC_FIELDS}  # asdict's deep copy: 0.1 ms
    derived.pop("e2e_ms", None)  # already on the raw record, same value
    derived.pop("completion_tokens", None)
    line.update(derived)
    line.update(text_quality(record.output).to_json())  # digit_ratio, rep_n, ..., text_sha256
    line["findings"] = [f.code for f in request.findings]
    line["finding_details"] = [f.to_json() for f in request.findings]
    return line


def derive_request(record: RequestRecord) -> JSONObject:
    """The one derivation of a single request's figures (request_line of derive_requests)."""
    return request_line(derive_requests([record])[0])


def _variant_block(requests: Sequence[RequestDerivation], block: BlockSettings) -> VariantSummary:
    """summary.json's block for one variant: per-request distributions (p50/p90/p99 over requests),
    the run-level figures vllm bench reports (`benchmark`: totals, throughputs, pooled ITL), how the
    chunks were stamped, and finding counts."""
    records = [r.record for r in requests]
    metrics = [r.metrics for r in requests]
    codes = Counter(f.code for r in requests for f in r.findings)
    hist: Counter[int] = Counter()
    for record in records:
        hist.update(tokens_per_chunk_hist(record))
    sources = Counter(m.token_source for m in metrics)
    return VariantSummary(
        requests=len(records),
        errors=sum(1 for r in records if r.status != Status.OK),
        model=", ".join(sorted({r.model for r in records})) or None,  # as sent (the served name)
        token_source=dict(sources),
        tokens_per_chunk_hist={str(k): v for k, v in sorted(hist.items())},
        client_loop_lag_ms=_loop_lag(records),
        schedule_lag_ms=summarize([schedule_lag_ms(r) for r in records]),
        **variant_summary(metrics),
        benchmark=benchmark_figures(records, metrics, block),
        stamp=dict(Counter(r.stamp or "unknown" for r in records)),
        findings=dict(sorted(codes.items())),
        categories=by_category(records, metrics),
    )


CATEGORY_METRICS = ("itl_ms", "tpot_ms", "decode_tokens_per_chunk")
# A folder's quality settings when nothing says otherwise (no meta.json, an older itlaudit's).
JUDGED_RELATIVELY = QualitySettings()
DEFAULT_BLOCK = BlockSettings()  # nor goodput SLOs, and the block's default percentiles


def by_category(
    records: Sequence[RequestRecord], metrics: Sequence[RequestMetrics]
) -> dict[str, dict[str, int | Figures]]:
    """Token ITL, TPOT and stream acceptance (decode tokens per chunk) per dataset category: draft
    acceptance, and so a speculative server's speedup, depends on what is being written. Requests
    without a category are left out; no categories, no breakdown."""
    groups: dict[str, list[RequestMetrics]] = {}
    server: dict[str, list[float]] = {}  # the server's own per-request acceptance length, when sent
    for record, figures in zip(records, metrics, strict=True):
        if record.category is not None:
            groups.setdefault(record.category, []).append(figures)
            counts = server_acceptance(record)
            if counts is not None and counts["steps"]:
                length = 1.0 + counts["accepted"] / counts["steps"]
                server.setdefault(record.category, []).append(length)
    return {
        name: {
            "requests": len(group),
            **{key: summarize([getattr(m, key) for m in group]) for key in CATEGORY_METRICS},
            # Exact where the server reports it (no /metrics window, no other traffic): preferred.
            **({"server_acceptance_length": summarize(server[name])} if name in server else {}),
        }
        for name, group in sorted(groups.items())
    }


def schedule_lag_ms(record: RequestRecord) -> float | None:
    """How late the client dispatched an open-loop request (send − scheduled): a late client sends a
    different workload than the one planned, and its p99 says how different."""
    if record.scheduled_ms is None or record.sent_offset_ms is None:
        return None
    return record.sent_offset_ms - record.scheduled_ms


def _loop_lag(records: Sequence[RequestRecord]) -> LoopLag:
    """The capture loops' lag over the variant: the worst request's p99 and the worst single stall."""
    p99s = [r.loop_lag_p99_ms for r in records if r.loop_lag_p99_ms is not None]
    maxes = [r.loop_lag_max_ms for r in records if r.loop_lag_max_ms is not None]
    return LoopLag(worst_p99=max(p99s) if p99s else None, max=max(maxes) if maxes else None)


def summarize_run(
    records: Sequence[RequestRecord],
    variant_order: Sequence[str] | None = None,
    derived: Sequence[RequestDerivation] | None = None,
    *,
    quality: QualitySettings = JUDGED_RELATIVELY,
    block: BlockSettings = DEFAULT_BLOCK,
    server: Mapping[str, JSONObject] | None = None,
) -> RunSummary:
    """summary.json: per-variant blocks in scenario order, then run-level findings. `derived` is
    derive_requests(records) when the caller has it already (each request's findings once); `quality`
    is meta.json's gate and dummy-weight variants (run_context.quality_settings), which the summary
    carries for the validity rule; `block` meta.json's goodput SLOs and percentiles (BlockSettings);
    `server` each variant's server block (store.server_metrics.server_blocks), kept in the summary and
    judged for launch_bound."""
    requests = derived if derived is not None else derive_requests(records)
    names = list(variant_order or [])
    names += [r.variant for r in records if r.variant not in names]
    variants: dict[str, VariantSummary] = {}
    for name in dict.fromkeys(names):
        variants[name] = _variant_block([r for r in requests if r.record.variant == name], block)
    run_level: list[Finding] = run_findings(records)
    server = dict(server or {})
    run_level += filter(
        None, (launch_bound_finding(name, server[name]) for name in variants if name in server)
    )
    for finding in run_level:
        judged = variants.get(str(finding.evidence.get("variant")))
        if judged is not None:
            judged.findings[finding.code] = judged.findings.get(finding.code, 0) + 1
    return RunSummary(
        variants=variants,
        run_findings=[f.to_json() for f in run_level],
        quality_gate=quality.gate,
        dummy_weights=[name for name in quality.dummy_weights if name in variants],
        synthetic_acceptance={name: forced for name, forced in quality.synthetic if name in variants},
        server=server,
    )


def _finding_variant(finding: Finding, variant_of: Mapping[str, str]) -> str | None:
    """The variant a comparison finding judges: named in its evidence, else its request's variant."""
    named = finding.evidence.get("variant")
    if isinstance(named, str):
        return named
    return variant_of.get(finding.request_id) if finding.request_id else None


def with_comparison_findings(
    summary: RunSummary, findings: Sequence[Finding], records: Sequence[RequestRecord]
) -> RunSummary:
    """The summary with compare.json's findings (lossless mismatches, acceptance disagreement,
    distribution shifts) among its run-level findings and counted in their variant's block, so that
    summary.json, the terminal block and both reports name the findings compare.json holds. Comparison
    findings already there (an earlier compare of an --append folder) are replaced, not added twice."""
    variant_of = {r.request_id: r.variant for r in records}
    counts = {name: Counter(block.findings) for name, block in summary.variants.items()}
    kept: list[dict[str, Any]] = []
    for line in summary.run_findings:
        old = Finding.from_json(line)
        if REGISTRY[old.code].scope is not Scope.COMPARISON:
            kept.append(line)
        elif (name := _finding_variant(old, variant_of)) in counts:
            counts[name][old.code] -= 1
    for finding in findings:
        if (name := _finding_variant(finding, variant_of)) in counts:
            counts[name][finding.code] += 1
    blocks = {
        name: msgspec.structs.replace(block, findings=dict(sorted((+counts[name]).items())))
        for name, block in summary.variants.items()
    }
    merged = [*kept, *(f.to_json() for f in findings)]
    return msgspec.structs.replace(summary, variants=blocks, run_findings=merged)
