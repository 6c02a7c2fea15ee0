"""What changed against the good end, in words and figures: the explanation a verdict carries, so a
128-token cap is never read as a slowdown and multi-token chunks never as slow tokens."""

from __future__ import annotations

from itlaudit.analysis import stats
from itlaudit.bisect.figures import ERROR_CODES, Figures, median
from itlaudit.model.vocabulary import Shift

# Fewer per-request ITL values than this and the U test cannot separate anything at alpha 0.05.
MIN_SAMPLES = 5
# Chunk ITL this much above token ITL means chunks carry several tokens (MTP / spec decode): the chunk
# figure is then worth explaining rather than quoting.
CHUNK_INFLATION = 1.2


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def itl_comparison(ref: Figures, probe: Figures, *, threshold: float, alpha: float) -> stats.Comparison:
    return stats.compare_samples(
        ref.itl_ms,
        probe.itl_ms,
        lower_is_better=True,
        threshold=threshold,
        alpha=alpha,
        min_samples=MIN_SAMPLES,
    )


def itl_text(cmp: stats.Comparison) -> str:
    figures = f"{ms(cmp.base_median)} → {ms(cmp.new_median)} ms/token"
    if cmp.base_median is None or cmp.new_median is None:
        return "no token ITL to compare"
    if cmp.verdict == Shift.WORSE:
        return f"token ITL up {cmp.ratio:.2f}× ({figures}, p = {cmp.p_value:.2g})"
    if cmp.verdict == Shift.BETTER:
        return f"token ITL down ({figures}, p = {cmp.p_value:.2g})"
    if cmp.verdict == Shift.SAME:
        return f"token ITL unchanged ({figures})"
    return f"token ITL unclear ({figures}: {cmp.reason})"


def explain(variant: str, probe: Figures, ref: Figures, *, threshold: float, alpha: float) -> str:
    """What changed against the good end, in figures: output length, errors, token ITL, and why a
    chunk ITL that looks slow is not (the seed's 72 ms was a 128-token cap read through K3 chunks)."""
    parts: list[str] = []
    tokens, ref_tokens = median(probe.completion_tokens), median(ref.completion_tokens)
    capped = probe.truncated > 0 and ref.truncated == 0
    if capped:
        was = "–" if ref_tokens is None else f"{ref_tokens:.0f}"
        parts.append(f"outputs capped at {tokens:.0f} tokens (was {was})" if tokens else "outputs cut short")
    elif tokens is not None and tokens == ref_tokens:
        parts.append(f"outputs full length ({tokens:.0f} tokens)")
    if probe.failures and not ref.failures:
        codes = ", ".join(f"{c}×{n}" for c, n in sorted(probe.findings.items()) if c in ERROR_CODES)
        parts.append(
            f"{probe.errors} of {probe.requests} requests failed (was 0{'; ' + codes if codes else ''})"
        )
    cmp = itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
    parts.append(itl_text(cmp))
    chunk, token = median(probe.chunk_itl_ms), median(probe.itl_ms)
    ref_chunk = median(ref.chunk_itl_ms)
    if chunk is not None and token and cmp.verdict != Shift.WORSE:
        causes = []
        if capped and ref_chunk and chunk / ref_chunk >= threshold:
            causes.append("the cap's")
        per_chunk = median(probe.tokens_per_chunk) or 1.0
        if chunk / token > CHUNK_INFLATION:
            causes.append(f"{variant}'s ({per_chunk:.1f} tokens per chunk)")
        if causes:
            parts.append(f"the {ms(chunk)} ms chunk ITL is {' and '.join(causes)} artefact")
    return "; ".join(parts)
