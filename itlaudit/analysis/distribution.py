"""Lossless speculative decoding at temperature > 0: the K>0 outputs must be sampled from the same
distribution as K0's.

At temperature 0 the lossless audit compares tokens (lossless.py), but sampled outputs differ from run
to run by design, so no token comparison can say whether speculative sampling kept the distribution.
What it must keep can still be measured: score every sampled output under one K0 server (prompt
logprobs of prompt + output) and take each request's mean log-likelihood per output token. Outputs
sampled from the target distribution have one distribution of that figure whatever produced them; a
sampler that keeps drafts it should have rejected (a greedy drafter taken as is) writes outputs that
are more likely than the model's own, one that draws from a flattened distribution less likely ones.

The test is the two-sided Mann–Whitney U on those per-request figures (requests are the independent
samples; stats.py's exact-where-possible p), the effect the difference of means in nats/token with a
bootstrap interval and Cliff's delta. A finding needs both p < ALPHA and a shift of at least
MIN_EFFECT_NATS, so a large run does not flag a shift too small to matter and a small one does not
flag noise. Pure: scored records in, figures and a finding out (capture/scoring.py does the asking).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from itlaudit.analysis.comparison import VariantComparison
from itlaudit.analysis.lossless import output_token_ids
from itlaudit.analysis.quality import gibberish_reasons, text_quality
from itlaudit.analysis.stats import compare_samples, min_achievable_p
from itlaudit.model.codes import SPEC_DECODE_DISTRIBUTION_SHIFT, Finding
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord, Status

# A comparison per variant, and a false alarm on a healthy server sends someone hunting for a bug:
# 1 %, not 5 %.
ALPHA = 0.01
# Smallest mean shift in nats per output token that is a finding. K0 against itself on Gemma 3 270M
# at temperature 0.8 (32 requests x 48 tokens) moves the mean by a few hundredths; the simulator's
# broken samplers move it by a nat or more.
MIN_EFFECT_NATS = 0.1
BOOTSTRAP_RESAMPLES = 2000
_WORST_SHOWN = 3
_EXCERPT_CHARS = 160


@dataclass(frozen=True)
class ScoredOutput:
    """One sampled request and the K0 server's log-probability of each of its output tokens."""

    record: RequestRecord
    logprobs: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Log-likelihood per output token, in nats: comparable across outputs of different lengths."""
        return math.fsum(self.logprobs) / len(self.logprobs)


def sampled(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests the audit can score: finished, sampled (temperature not 0; unset is the server's
    default, which samples) and with every output token id on the stream."""
    return [
        r
        for r in records
        if r.status == Status.OK
        and not r.warmup
        and r.params.temperature != 0
        and output_token_ids(r) is not None
    ]


def speculates(row: VariantComparison) -> bool:
    """Whether a compare.json variant row shows speculative decoding: drafts in /metrics, or (a server
    without the counters) more than one token per decode chunk on the stream."""
    if row.spec_decode is not None:
        return row.spec_decode.num_drafts > 0
    stream = row.stream_acceptance_length
    return stream is not None and stream > 1.0


def quality_figures(records: Sequence[RequestRecord]) -> JSONObject:
    """Output-quality figures of one variant, beside its likelihood: a broken sampler that writes
    loops or digit soup shows here too."""
    judged = [text_quality(r.output) for r in records]
    if not judged:
        return {"requests": 0, "gibberish_share": None, "rep_3_mean": None, "compression_ratio_median": None}
    return {
        "requests": len(judged),
        "gibberish_share": sum(1 for q in judged if gibberish_reasons(q)) / len(judged),
        "rep_3_mean": float(np.mean([q.rep_3 for q in judged])),
        "compression_ratio_median": float(np.median([q.compression_ratio for q in judged])),
    }


def _bootstrap_ci(base: np.ndarray, spec: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of mean(spec) − mean(base), both groups resampled (seeded: the same
    run gives the same interval)."""
    rng = np.random.default_rng(seed)
    b = rng.choice(base, (BOOTSTRAP_RESAMPLES, base.size)).mean(axis=1)
    s = rng.choice(spec, (BOOTSTRAP_RESAMPLES, spec.size)).mean(axis=1)
    low, high = np.percentile(s - b, [2.5, 97.5])
    return float(low), float(high)


def _cliffs_delta(base: np.ndarray, spec: np.ndarray) -> float:
    """P(spec > base) − P(spec < base) over all pairs: −1..1, 0 when neither side tends higher."""
    diff = np.sign(spec[:, None] - base[None, :])
    return float(diff.mean())


def _excerpt(item: ScoredOutput) -> JSONObject:
    text = item.record.text
    return {
        "request_id": item.record.request_id,
        "mean_logprob": item.mean,
        "tokens": len(item.logprobs),
        "text": text[:_EXCERPT_CHARS] + ("…" if len(text) > _EXCERPT_CHARS else ""),
    }


def distribution_shift(
    baseline: str,
    variant: str,
    base: Sequence[ScoredOutput],
    spec: Sequence[ScoredOutput],
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT_NATS,
) -> tuple[JSONObject, Finding | None]:
    """The variant's figures against the baseline's (compare.json's distribution block) and a
    spec_decode_distribution_shift finding when the shift is both significant and large enough.
    `verdict` is "shift", "same" or "unknown" (too few samples for p < alpha to be possible)."""
    b = np.array([s.mean for s in base if s.logprobs], dtype=float)
    s = np.array([x.mean for x in spec if x.logprobs], dtype=float)
    figures: JSONObject = {
        "baseline": baseline,
        "n_base": int(b.size),
        "n_spec": int(s.size),
        "alpha": alpha,
        "min_effect_nats": min_effect,
        "base_mean": float(b.mean()) if b.size else None,
        "spec_mean": float(s.mean()) if s.size else None,
        "base_quality": quality_figures([x.record for x in base]),
        "spec_quality": quality_figures([x.record for x in spec]),
    }
    if min(b.size, s.size) < 2 or min_achievable_p(int(b.size), int(s.size)) >= alpha:
        figures.update(
            verdict="unknown",
            p_value=None,
            reason=f"{b.size} vs {s.size} scored outputs cannot reach p < {alpha:g}",
        )
        return figures, None
    # compare_samples runs the two-sided Mann–Whitney U (exact where the splits can be enumerated);
    # its verdict is about medians, this audit's about the mean shift, so only its p is taken.
    p_value = compare_samples(
        b.tolist(), s.tolist(), lower_is_better=False, alpha=alpha, min_samples=2
    ).p_value
    effect = float(s.mean() - b.mean())
    low, high = _bootstrap_ci(b, s)
    shifted = p_value is not None and p_value < alpha and abs(effect) >= min_effect
    figures.update(
        verdict="shift" if shifted else "same",
        p_value=p_value,
        effect_nats=effect,
        effect_ci95=[low, high],
        cliffs_delta=_cliffs_delta(b, s),
    )
    if not shifted:
        return figures, None
    # The requests that pull hardest in the direction of the shift are the ones to read.
    ranked = sorted((x for x in spec if x.logprobs), key=lambda x: x.mean, reverse=effect > 0)
    worst = [_excerpt(x) for x in ranked[:_WORST_SHOWN]]
    direction = "more" if effect > 0 else "less"
    message = (
        f"Variant {variant!r}: at temperature > 0 its outputs are {direction} likely under the K0 server "
        f"than {baseline!r}'s own ({figures['spec_mean']:.3f} vs {figures['base_mean']:.3f} nats/token, "
        f"shift {effect:+.3f} [{low:+.3f}, {high:+.3f}], Mann–Whitney p = {p_value:.2g} over "
        f"{s.size} vs {b.size} requests): speculative sampling changed the output distribution, which "
        "rejection sampling must leave as it is."
    )
    evidence = {**figures, "variant": variant, "worst": worst}
    return figures, Finding.of(SPEC_DECODE_DISTRIBUTION_SHIFT, message, evidence)
