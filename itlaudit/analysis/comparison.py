"""K0-vs-K3 figures (pure): speedups over the baseline variant and the stream-vs-/metrics
acceptance cross-check. The baseline is the scenario's first variant, normally K=0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from itlaudit.analysis.lossless import spec_decode_mismatches
from itlaudit.analysis.metrics import decode_gaps, p50, ratio, token_counts
from itlaudit.analysis.specdecode import SpecDecodeStats
from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import COMPARABLE, comparison_validity, quality_note, variant_validity
from itlaudit.model.codes import ACCEPTANCE_LENGTH_MISMATCH, STREAM_BUNDLED, Finding
from itlaudit.model.formats import FORMAT_KEY
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord, Status

# Stream and counters measure the same thing but round differently (the last chunk of a request
# carries the remainder, prefill is excluded); past 10% they describe different traffic.
ACCEPTANCE_TOLERANCE = 0.10


class VariantComparison(msgspec.Struct, kw_only=True):
    """One variant's row of compare.json. Every field has a default so a row an older itlaudit wrote
    (without `not_comparable`, `stream_accepted_tokens` or `prefix_cache`) reads with those unknown;
    every field is written, null where unknown, as the dict it replaced wrote them."""

    not_comparable: str | None = None  # analysis.validity's reason; its speedups are then no result
    itl_ms_p50: float | None = None
    chunk_itl_ms_p50: float | None = None
    decode_tokens_per_s_p50: float | None = None
    completion_tokens_p50: float | None = None
    speedup_token_itl: float | None = None
    speedup_chunk_itl: float | None = None
    speedup_decode_tokens_per_s: float | None = None
    stream_acceptance_length: float | None = None
    stream_accepted_tokens: int | None = None
    spec_decode: SpecDecodeStats | None = None  # the server's /metrics acceptance over the window
    prefix_cache: dict[str, float | None] | None = None  # the server's prefix-cache counters over the window
    # engine steps a decode chunk carries where the server bundles them (stream_bundled); None: one
    steps_per_chunk: float | None = None
    # why the lossless and distribution audits did not judge this variant ("not applicable: synthetic
    # acceptance ..."): a forced acceptance is not lossless by construction, so a mismatch is no bug
    not_audited: str | None = None


class CompareResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """compare.json: the baseline's name, a row per variant in scenario order, the cross-variant
    findings (JSON form), and the temperature > 0 distribution audit's block when one ran. `format`
    is stamped by the writer; `from_json` reads the previous, unversioned format too."""

    baseline: str | None
    variants: dict[str, VariantComparison]
    findings: list[dict[str, Any]]
    distribution: dict[str, Any] | None = None
    # analysis.validity's phrase when gibberish was measured and did not gate (both sides write it)
    quality: str | None = None

    def to_json(self) -> JSONObject:
        """compare.json's content (without `format`, which the writer stamps)."""
        data: JSONObject = msgspec.to_builtins(self)
        return data

    @classmethod
    def from_json(cls, data: object) -> CompareResult | None:
        """A compare.json's content, of this format or the previous one; None for one cut short or
        otherwise unreadable: compare.json is written by another command, so its figures are then
        absent rather than an error."""
        if not isinstance(data, dict):
            return None
        try:
            return msgspec.convert({k: v for k, v in data.items() if k != FORMAT_KEY}, cls)
        except msgspec.ValidationError:
            return None


def stream_acceptance_length(records: Sequence[RequestRecord]) -> float | None:
    """Tokens per decode chunk over all finished requests: what /metrics' acceptance length predicts
    when every engine step reaches the client as one chunk."""
    tokens = chunks = 0
    for record in records:
        if record.status != Status.OK:
            continue
        _, cumulative, _ = token_counts(record)
        if len(cumulative) >= 2:
            tokens += int(cumulative[-1] - cumulative[0])
            chunks += len(cumulative) - 1
    return tokens / chunks if chunks else None


def _decode_chunks(records: Sequence[RequestRecord]) -> int:
    return sum(max(len(token_counts(r)[1]) - 1, 0) for r in records if r.status == Status.OK)


def stream_accepted_tokens(records: Sequence[RequestRecord]) -> int | None:
    """Accepted draft tokens as the stream shows them: each decode step brings one token of the
    target's own plus its accepted drafts, so accepted = decode tokens − decode chunks.

    This is the cross-check that survives drafters that sometimes propose nothing (ngram when no
    n-gram matches): /metrics' acceptance length divides by the steps that drafted, the stream's by
    every step, so those two drift apart while the accepted-token counts still agree (vLLM 0.24.0 on
    an H200, ngram K=3: 4088 − 1484 = 2604 on the stream vs 2612 in /metrics)."""
    accepted = 0
    seen = False
    for record in records:
        if record.status != Status.OK:
            continue
        _, cumulative, _ = token_counts(record)
        if len(cumulative) >= 2:
            accepted += int(cumulative[-1] - cumulative[0]) - (len(cumulative) - 1)
            seen = True
    return accepted if seen else None


def acceptance_reading(row: VariantComparison) -> str | None:
    """Why the server's acceptance length and the stream's tokens per decode chunk differ, when they
    do and the accepted tokens agree: the server divides by the steps that drafted, the stream by
    every decode step (ngram proposes nothing without a match). None when they agree, or when the
    difference is not explained that way (then acceptance_length_mismatch fires)."""
    spec = row.spec_decode
    if spec is None:
        return None
    server_al, stream_al = spec.acceptance_length, row.stream_acceptance_length
    accepted, server_accepted = row.stream_accepted_tokens, spec.num_accepted_tokens
    drafts = spec.num_drafts
    gap = _apart(stream_al, server_al)
    if gap is None or gap <= ACCEPTANCE_TOLERANCE or not accepted or stream_al is None or stream_al <= 1:
        return None
    if not server_accepted or not drafts or (_apart(accepted, server_accepted) or 0) > ACCEPTANCE_TOLERANCE:
        return None
    steps = accepted / (stream_al - 1)
    return (
        f"the server drafted on {drafts:.0f} of {steps:.0f} decode steps: its acceptance length counts "
        f"those only, the stream's every step; both count {accepted} vs {server_accepted:.0f} accepted tokens"
    )


def _apart(a: float | None, b: float | None) -> float | None:
    """Relative gap of a from the reference b; None when either is unknown or b is zero."""
    return abs(a - b) / b if a is not None and b else None


def _acceptance_mismatch(
    name: str, records: Sequence[RequestRecord], stats: SpecDecodeStats | None
) -> Finding | None:
    """Fires when the stream and /metrics disagree on acceptance length, unless the accepted tokens
    agree and /metrics counts no more drafting steps than the stream has decode steps: that is a
    drafter that skipped steps (ngram without a match), not lost chunks or foreign traffic."""
    stream_al = stream_acceptance_length(records)
    metrics_al = stats.acceptance_length if stats else None
    length_gap = _apart(stream_al, metrics_al)
    if stats is None or length_gap is None or length_gap <= ACCEPTANCE_TOLERANCE:
        return None
    stream_accepted = stream_accepted_tokens(records)
    accepted_gap = _apart(stream_accepted, stats.num_accepted_tokens)
    steps = _decode_chunks(records)
    skipped_steps = stats.num_drafts <= steps * (1 + ACCEPTANCE_TOLERANCE)
    if accepted_gap is not None and accepted_gap <= ACCEPTANCE_TOLERANCE and skipped_steps:
        return None
    accepted_text = (
        f"; accepted tokens {stream_accepted} on the stream vs {stats.num_accepted_tokens:.0f} in /metrics"
        if stream_accepted is not None
        else ""
    )
    if not skipped_steps:
        conclusion = (
            f"/metrics counts {stats.num_drafts:.0f} drafting steps against the stream's {steps} decode "
            "steps, so other requests reached the server in the window"
        )
    else:
        conclusion = "the server's accepted drafts did not reach this stream as tokens: chunks were lost"
    return Finding.of(
        ACCEPTANCE_LENGTH_MISMATCH,
        message=(
            f"Variant {name!r}: the stream shows {stream_al:.2f} tokens per decode chunk but /metrics "
            f"says acceptance length {metrics_al:.2f} ({length_gap:.0%} apart){accepted_text}. "
            f"Conclusion: {conclusion}."
        ),
        evidence={
            "variant": name,
            "stream": stream_al,
            "metrics": metrics_al,
            "gap": length_gap,
            "stream_accepted_tokens": stream_accepted,
            "metrics_accepted_tokens": stats.num_accepted_tokens,
            "accepted_gap": accepted_gap,
            "stream_decode_chunks": steps,
            "metrics_drafts": stats.num_drafts,
        },
    )


BUNDLED_SHARE = 0.10  # of decode chunks over one step's tokens: a rare one is a retransmit, not a habit
BUNDLED_CHUNKS = 3


def _bundled(
    name: str, records: Sequence[RequestRecord], limit: int | None, stats: SpecDecodeStats | None
) -> tuple[Finding, float] | None:
    """Fires when the variant's decode chunks carry more tokens than one engine step can make (K+1)
    often enough to be the server's way of streaming: it sends several steps a chunk. How many is
    estimated as the stream's tokens per decode chunk over the server's tokens per step (its
    acceptance length; 1 without speculation): the finding, and that estimate."""
    if limit is None:
        return None
    increments = [
        int(k) for record in records if record.status == Status.OK for k in decode_gaps(record)[1] if k > 0
    ]
    over = sum(1 for k in increments if k > limit)
    if over < BUNDLED_CHUNKS or over < BUNDLED_SHARE * len(increments):
        return None
    per_chunk = sum(increments) / len(increments)
    per_step = (stats.acceptance_length if stats is not None else None) or 1.0
    steps = per_chunk / per_step
    finding = Finding.of(
        STREAM_BUNDLED,
        message=(
            f"Variant {name!r}: {over} of {len(increments)} decode chunks carried more than {limit} "
            f"token{'s' if limit > 1 else ''}, the most one engine step makes here "
            f"({'K=' + str(limit - 1) if limit > 1 else 'no speculative decoding'}, from /metrics): the "
            f"server sends about {steps:.1f} steps a chunk (--stream-interval or its like). Its chunk ITL "
            f"is per chunk of ~{steps:.1f} steps, not a step time, and its {per_chunk:.2f} tokens per "
            "decode chunk is not an acceptance length; the token ITL is unaffected."
        ),
        evidence={
            "variant": name,
            "step_tokens": limit,
            "chunks_over": over,
            "decode_chunks": len(increments),
            "tokens_per_decode_chunk": per_chunk,
            "steps_per_chunk": steps,
        },
    )
    return finding, steps


def build_comparison(
    summary: RunSummary,
    records: Sequence[RequestRecord],
    spec_stats: dict[str, SpecDecodeStats | None],
    step_tokens: Mapping[str, int | None] | None = None,
) -> CompareResult:
    """compare.json: per-variant figures, speedups vs the first variant, cross-check findings
    (stream vs /metrics acceptance; greedy outputs that differ from the baseline's). `not_comparable`
    is analysis.validity's reason when the variant or the baseline breaks the rule (None otherwise):
    its speedups are figures, not a result, and no reader may print them as one. `step_tokens`: the
    most tokens one engine step makes per variant (specdecode.step_token_limit), for stream_bundled."""
    variants = summary.variants
    names = list(variants)
    base = variants[names[0]].distributions if names else {}
    base_validity = variant_validity(summary, names[0]) if names else COMPARABLE
    out = CompareResult(
        baseline=names[0] if names else None, variants={}, findings=[], quality=quality_note(summary)
    )
    for name in names:
        block = variants[name].distributions
        stats = spec_stats.get(name)
        mine = [r for r in records if r.variant == name]
        stream_al = stream_acceptance_length(mine)
        stream_accepted = stream_accepted_tokens(mine)
        own = variant_validity(summary, name)
        validity = own if name == names[0] else comparison_validity(own, base_validity, names[0])
        out.variants[name] = VariantComparison(
            not_comparable=validity.reason,
            itl_ms_p50=p50(block, "itl_ms"),
            chunk_itl_ms_p50=p50(block, "chunk_itl_ms"),
            decode_tokens_per_s_p50=p50(block, "decode_tokens_per_s"),
            completion_tokens_p50=p50(block, "completion_tokens"),
            speedup_token_itl=ratio(p50(base, "itl_ms"), p50(block, "itl_ms")),
            speedup_chunk_itl=ratio(p50(base, "chunk_itl_ms"), p50(block, "chunk_itl_ms")),
            speedup_decode_tokens_per_s=ratio(
                p50(block, "decode_tokens_per_s"), p50(base, "decode_tokens_per_s")
            ),
            stream_acceptance_length=stream_al,
            stream_accepted_tokens=stream_accepted,
            spec_decode=stats,
        )
        # Bundled steps explain a stream acceptance above the server's: one finding says so, not two.
        bundled = _bundled(name, mine, (step_tokens or {}).get(name), stats)
        if bundled is not None:
            out.findings.append(bundled[0].to_json())
            out.variants[name].steps_per_chunk = bundled[1]
        elif (mismatch := _acceptance_mismatch(name, mine, stats)) is not None:
            out.findings.append(mismatch.to_json())
    baseline = [r for r in records if r.variant == out.baseline]
    forced = summary.synthetic_acceptance
    for name in names[1:]:
        if name in forced:
            out.variants[name].not_audited = f"not applicable: synthetic acceptance ({forced[name]})"
            continue
        mismatches = spec_decode_mismatches(baseline, [r for r in records if r.variant == name])
        out.findings += [f.to_json() for f in mismatches]
    return out
