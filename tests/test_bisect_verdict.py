"""Verdict rules on synthetic trials: findings, errors, timing with the U test, script exit codes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from itlaudit.bisect.errors import BisectError
from itlaudit.bisect.verdict import Regress, Trial, judge, metrics, parse_regress, script_answer


def _trial(itl: list[float], *, errors: int = 0, **found: int) -> Trial:
    return Trial(
        itl_ms=itl,
        completion_tokens=[160] * len(itl),
        requests=len(itl) + errors,
        errors=errors,
        findings=Counter(found),
    )


def test_truncation_and_finding_rules() -> None:
    capped = _trial([1.0] * 3, truncated_below_max_tokens=3, common_cap=1)
    clean = _trial([1.0] * 3)
    assert judge(Regress("truncation"), [capped], None, threshold=1.5, alpha=0.05).present is True
    assert judge(Regress("truncation"), [clean], None, threshold=1.5, alpha=0.05).present is False
    rule = parse_regress("finding:common_cap")
    assert judge(rule, [capped], None, threshold=1.5, alpha=0.05).reason == "common_cap×1"
    nothing = Trial([], [], requests=3, errors=3)
    assert judge(Regress("truncation"), [nothing], None, threshold=1.5, alpha=0.05).present is None


def test_error_rule_counts_failed_requests_and_error_findings() -> None:
    assert judge(Regress("error"), [_trial([1.0], errors=1)], None, threshold=1.5, alpha=0.05).present
    assert judge(Regress("error"), [_trial([1.0], stream_error=1)], None, threshold=1.5, alpha=0.05).present
    assert not judge(Regress("error"), [_trial([1.0] * 3)], None, threshold=1.5, alpha=0.05).present


def test_itl_needs_significance_and_the_threshold() -> None:
    rng = np.random.default_rng(0)
    base = list(rng.normal(10, 0.5, 12))
    slow = [_trial(list(rng.normal(72, 3, 4))) for _ in range(3)]
    same = [_trial(list(rng.normal(10.3, 0.5, 4))) for _ in range(3)]
    rule = Regress("itl")
    bad = judge(rule, slow, base, threshold=1.5, alpha=0.05)
    assert bad.present is True and bad.detail["ratio"] > 6
    assert judge(rule, same, base, threshold=1.5, alpha=0.05).present is False
    # Twice as slow but two values only: not enough to say anything -> more trials.
    assert judge(rule, [_trial([20.0, 21.0])], base, threshold=1.5, alpha=0.05).present is None
    # The good end itself only has to produce a measurement.
    assert judge(rule, same, None, threshold=1.5, alpha=0.05).present is False
    assert metrics(slow)["itl_p50_ms"] == pytest.approx(np.median([v for t in slow for v in t.itl_ms]))


def test_script_exit_codes_follow_git_bisect_run() -> None:
    assert script_answer(0, "s") is False
    assert script_answer(1, "s") is True and script_answer(127, "s") is True
    assert script_answer(125, "s") is None
    with pytest.raises(BisectError, match="stopping the bisection"):
        script_answer(128, "s")
