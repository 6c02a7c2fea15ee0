"""Verdict rule on constructed distributions: each case is one the rule must not get wrong."""

from __future__ import annotations

import numpy as np
import pytest

from itlaudit.analysis.stats import compare_samples, min_achievable_p
from itlaudit.model.vocabulary import Shift


def _latencies(median: float, n: int = 60, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return (median * rng.lognormal(0.0, 0.1, n)).tolist()


def test_two_x_slowdown_is_worse() -> None:
    result = compare_samples(_latencies(10), _latencies(20, seed=1), lower_is_better=True)
    assert result.verdict == Shift.WORSE
    assert result.ratio == pytest.approx(2.0, rel=0.1)
    assert result.p_value is not None and result.p_value < 1e-6


def test_two_x_faster_throughput_is_better() -> None:
    result = compare_samples(_latencies(100), _latencies(200, seed=1), lower_is_better=False)
    assert result.verdict == Shift.BETTER


def test_identical_is_same() -> None:
    data = _latencies(10)
    result = compare_samples(data, list(data), lower_is_better=True)
    assert result.verdict == Shift.SAME
    assert result.ratio == 1.0


def test_small_real_shift_is_same_not_worse() -> None:
    """Significant but below the threshold: a CI gate must not fail on a 3 % drift."""
    result = compare_samples(_latencies(10, 2000), _latencies(10.3, 2000, seed=1), lower_is_better=True)
    assert result.p_value is not None and result.p_value < 0.05
    assert result.verdict == Shift.SAME


@pytest.mark.parametrize(
    ("base", "new"),
    [([10.0, 11.0, 12.0], [10.5, 11.5, 12.5]), ([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])],
    ids=["overlapping", "separated"],
)
def test_three_vs_three_is_unknown(base: list[float], new: list[float]) -> None:
    assert compare_samples(base, new, lower_is_better=True).verdict == Shift.UNKNOWN


def test_noisy_large_difference_is_unknown() -> None:
    base = [1.0, 50.0, 2.0, 40.0, 3.0, 30.0]
    new = [2.0, 60.0, 4.0, 45.0, 6.0, 35.0]
    result = compare_samples(base, new, lower_is_better=True)
    assert result.p_value is not None and result.p_value > 0.05
    assert result.verdict == Shift.UNKNOWN


def test_missing_values_are_dropped_and_too_few_is_unknown() -> None:
    result = compare_samples([1.0, None, float("nan")], [1.0, 2.0, 3.0], lower_is_better=True)
    assert result.verdict == Shift.UNKNOWN
    assert result.n_base == 1
    assert result.p_value is None


def test_rise_from_zero_is_worse() -> None:
    result = compare_samples([0.0] * 20, [5.0] * 20, lower_is_better=True)
    assert result.ratio is None
    assert result.verdict == Shift.WORSE


def test_min_achievable_p() -> None:
    assert min_achievable_p(3, 3) == pytest.approx(0.1)
    assert min_achievable_p(4, 4) < 0.05
