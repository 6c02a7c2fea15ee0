"""Is NEW better, worse or the same as BASE? One verdict rule shared by `diff` and `bisect`.

Benchmarks are noisy, and two failure modes matter: calling noise a regression (a CI gate that cries
wolf gets switched off), and calling a run "same" when it had too few samples to tell. So a verdict
needs both a statistically significant difference (two-sided Mann–Whitney U: no normality assumption,
robust to the long tails latency has) and a practically large one (ratio of medians beyond a
threshold). When the sample sizes cannot reach significance at all, the answer is "unknown", never
"same".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from itlaudit.analysis import metrics
from itlaudit.model.vocabulary import Shift

# A ratio within ±2 % of 1 is worded "≈ same" wherever itlaudit words a factor without a test (the
# report's headline, the plots): "1.00× slower" would suggest a difference that is not there.
SAME_BAND = 0.02


@dataclass(frozen=True)
class Comparison:
    """The verdict and the numbers behind it, so a report can show why it was reached.

    `ratio` is median(new) / median(base) whatever the direction of "better" (2.0 = new is twice the
    base value); None when the base median is 0 and the new one is not. `p_value` is None when the test
    was not run (too few samples). `reason` is one human sentence explaining the verdict.
    """

    verdict: Shift
    ratio: float | None
    p_value: float | None
    base_median: float | None
    new_median: float | None
    n_base: int
    n_new: int
    reason: str


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def min_achievable_p(n_base: int, n_new: int) -> float:
    """Smallest two-sided exact Mann–Whitney p for these sizes (complete separation): 2 / C(n1+n2, n1).

    3 vs 3 gives 0.1, so no data, however separated, can be significant at 0.05: that is "unknown".
    """
    if n_base + n_new > 60:  # 2 / C(60, 30) ≈ 2e-17, and for thousands of samples 2 / C overflows
        return 0.0
    return min(1.0, 2.0 / math.comb(n_base + n_new, n_base))


# Up to this many ways of splitting the pooled samples into the two groups, the p-value enumerates
# them all (exact, ties included: ~0.1 s at the limit); beyond it both groups hold 8+ samples and the
# normal approximation with tie correction is close.
EXACT_SPLITS = 20_000


def _p_value(b: np.ndarray, n: np.ndarray, mannwhitneyu: Any) -> float:
    """Two-sided Mann–Whitney p, exact wherever the splits can be enumerated.

    scipy's default turns to the normal approximation as soon as values tie, and tied values are the
    rule for token counts: 3 requests of 128 tokens vs 3 of 256 gave p 0.047, below 0.05, although no
    3-vs-3 split can reach it (min_achievable_p is 0.1). Enumerating the splits gives that 0.1, so the
    p shown and the verdict always agree."""
    from scipy.stats import PermutationMethod

    exact = math.comb(b.size + n.size, b.size) <= EXACT_SPLITS
    method = PermutationMethod(n_resamples=EXACT_SPLITS) if exact else "auto"
    return float(mannwhitneyu(b, n, alternative="two-sided", method=method).pvalue)


def compare_samples(
    base: Sequence[float | None],
    new: Sequence[float | None],
    *,
    lower_is_better: bool,
    threshold: float = 1.1,
    alpha: float = 0.05,
    min_samples: int = 3,
) -> Comparison:
    """Verdict for one metric from its per-request samples in two runs.

    None and non-finite samples are dropped (a metric undefined for a request is not a zero).

    - unknown: fewer than `min_samples` on either side, sizes too small for p < `alpha` to be
      possible (3 vs 3: even identical-looking data cannot be called "same"), or a difference of at
      least `threshold`× in medians that is not significant.
    - better / worse: significant (p < alpha) and the median moved by at least `threshold`× in the
      direction `lower_is_better` says is good (ITL, TTFT: lower; tokens/s: higher).
    - same: the medians are within `threshold`× of each other (significant or not: a 2 % shift
      measured over 10 000 requests is real but not a regression worth failing CI over).
    """
    if threshold < 1:
        raise ValueError("threshold is a ratio ≥ 1 (1.1 = a 10 % change)")
    b, n = _finite(base), _finite(new)
    base_median = float(np.median(b)) if b.size else None
    new_median = float(np.median(n)) if n.size else None
    # Two zero medians are the same figure (ratio 1); a rise from zero has no ratio.
    ratio = 1.0 if base_median == new_median == 0 else metrics.ratio(new_median, base_median)

    def result(verdict: Shift, p_value: float | None, reason: str) -> Comparison:
        return Comparison(verdict, ratio, p_value, base_median, new_median, int(b.size), int(n.size), reason)

    if min(b.size, n.size) < min_samples:
        return result(
            Shift.UNKNOWN,
            None,
            f"too few samples ({b.size} vs {n.size}; need {min_samples} each)",
        )
    # scipy costs ~1 s to import: only when a test is run
    from scipy.stats import mannwhitneyu

    p_value = _p_value(b, n, mannwhitneyu)
    if min_achievable_p(b.size, n.size) > alpha:
        return result(Shift.UNKNOWN, p_value, f"{b.size} vs {n.size} samples cannot reach p < {alpha:g}")
    if ratio is not None and 1 / threshold < ratio < threshold:
        return result(Shift.SAME, p_value, f"medians within {threshold:g}× of each other")
    if p_value >= alpha:
        return result(Shift.UNKNOWN, p_value, f"difference not significant (p = {p_value:.3g} ≥ {alpha:g})")
    # ratio is None only when base median is 0 and new is not: new went up from nothing.
    went_up = ratio is None or ratio > 1
    verdict = Shift.WORSE if went_up == lower_is_better else Shift.BETTER
    return result(verdict, p_value, f"significant (p = {p_value:.3g}) and beyond {threshold:g}×")
