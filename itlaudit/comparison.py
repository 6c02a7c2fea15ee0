"""K0-vs-K3 figures (pure): speedups over the baseline variant and the stream-vs-/metrics
acceptance cross-check. The baseline is the scenario's first variant, normally K=0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from itlaudit.findings import ERROR, Finding
from itlaudit.lossless import spec_decode_mismatches
from itlaudit.metrics import token_counts
from itlaudit.records import STATUS_OK, RequestRecord
from itlaudit.specdecode import SpecDecodeStats

ACCEPTANCE_LENGTH_MISMATCH = "acceptance_length_mismatch"
# Stream and counters measure the same thing but round differently (the last chunk of a request
# carries the remainder, prefill is excluded); past 10% they describe different traffic.
ACCEPTANCE_TOLERANCE = 0.10


def stream_acceptance_length(records: Sequence[RequestRecord]) -> float | None:
    """Tokens per decode chunk over all finished requests: what /metrics' acceptance length predicts
    when every engine step reaches the client as one chunk."""
    tokens = chunks = 0
    for record in records:
        if record.status != STATUS_OK:
            continue
        _, cumulative, _ = token_counts(record)
        if len(cumulative) >= 2:
            tokens += int(cumulative[-1] - cumulative[0])
            chunks += len(cumulative) - 1
    return tokens / chunks if chunks else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _p50(block: dict[str, Any], key: str) -> float | None:
    return (block.get(key) or {}).get("p50")


def build_comparison(
    summary: dict[str, Any],
    records: Sequence[RequestRecord],
    spec_stats: dict[str, SpecDecodeStats | None],
) -> dict[str, Any]:
    """compare.json: per-variant figures, speedups vs the first variant, cross-check findings
    (stream vs /metrics acceptance; greedy outputs that differ from the baseline's)."""
    variants: dict[str, Any] = summary["variants"]
    names = list(variants)
    base = variants[names[0]] if names else {}
    out: dict[str, Any] = {"baseline": names[0] if names else None, "variants": {}, "findings": []}
    for name in names:
        block = variants[name]
        stats = spec_stats.get(name)
        stream_al = stream_acceptance_length([r for r in records if r.variant == name])
        metrics_al = stats.acceptance_length if stats else None
        out["variants"][name] = {
            "itl_ms_p50": _p50(block, "itl_ms"),
            "chunk_itl_ms_p50": _p50(block, "chunk_itl_ms"),
            "decode_tokens_per_s_p50": _p50(block, "decode_tokens_per_s"),
            "completion_tokens_p50": _p50(block, "completion_tokens"),
            "speedup_token_itl": _ratio(_p50(base, "itl_ms"), _p50(block, "itl_ms")),
            "speedup_chunk_itl": _ratio(_p50(base, "chunk_itl_ms"), _p50(block, "chunk_itl_ms")),
            "speedup_decode_tokens_per_s": _ratio(
                _p50(block, "decode_tokens_per_s"), _p50(base, "decode_tokens_per_s")
            ),
            "stream_acceptance_length": stream_al,
            "spec_decode": stats.to_json() if stats else None,
        }
        if stream_al is not None and metrics_al is not None:
            gap = abs(stream_al - metrics_al) / metrics_al
            if gap > ACCEPTANCE_TOLERANCE:
                out["findings"].append(
                    Finding(
                        code=ACCEPTANCE_LENGTH_MISMATCH,
                        severity=ERROR,
                        message=(
                            f"Variant {name!r}: the stream shows {stream_al:.2f} tokens per decode chunk "
                            f"but /metrics says acceptance length {metrics_al:.2f} ({gap:.0%} apart): chunks "
                            "were merged or lost on the way, or other traffic reached the server."
                        ),
                        evidence={"variant": name, "stream": stream_al, "metrics": metrics_al, "gap": gap},
                    ).to_json()
                )
    baseline = [r for r in records if r.variant == out["baseline"]]
    for name in names[1:]:
        mismatches = spec_decode_mismatches(baseline, [r for r in records if r.variant == name])
        out["findings"] += [f.to_json() for f in mismatches]
    return out
