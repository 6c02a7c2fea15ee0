"""Verdict rules on synthetic figures: findings, errors, timing with the U test, auto's flipped
signals and their explanation, the K3/K0 speedup, script exit codes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from itlaudit.bisect.verdict import Figures, Regress, judge, parse_regress, script_answer
from itlaudit.errors import BisectError

T, A = 1.5, 0.05


def _trial(
    itl: list[float],
    *,
    errors: int = 0,
    tokens: int = 160,
    per_chunk: float = 1.0,
    **found: int,
) -> Figures:
    return Figures(
        itl_ms=itl,
        completion_tokens=[tokens] * len(itl),
        requests=len(itl) + errors,
        errors=errors,
        findings=Counter(found),
        chunk_itl_ms=[v * per_chunk for v in itl],
        tokens_per_chunk=[per_chunk] * len(itl),
    )


def _one(regress: Regress, trials: list[Figures], ref: list[Figures] | None = None, name: str = "K0"):
    reference = {name: Figures.pool(ref)} if ref is not None else None
    return judge(regress, {name: Figures.pool(trials)}, reference, [name], threshold=T, alpha=A)


def test_truncation_and_finding_rules() -> None:
    capped = _trial([1.0] * 3, truncated_below_max_tokens=3, common_cap=1)
    clean = _trial([1.0] * 3)
    assert _one(Regress("truncation"), [capped]).present is True
    assert _one(Regress("truncation"), [clean]).present is False
    assert _one(parse_regress("finding:common_cap"), [capped]).reason == "common_cap×1"
    nothing = Figures([], [], requests=3, errors=3)
    assert _one(Regress("truncation"), [nothing]).present is None


def test_error_rule_counts_failed_requests_and_error_findings() -> None:
    assert _one(Regress("error"), [_trial([1.0], errors=1)]).present
    assert _one(Regress("error"), [_trial([1.0], stream_error=1)]).present
    assert not _one(Regress("error"), [_trial([1.0] * 3)]).present


def test_itl_needs_significance_and_the_threshold() -> None:
    rng = np.random.default_rng(0)
    base = [_trial(list(rng.normal(10, 0.5, 12)))]
    slow = [_trial(list(rng.normal(72, 3, 4))) for _ in range(3)]
    same = [_trial(list(rng.normal(10.3, 0.5, 4))) for _ in range(3)]
    rule = Regress("itl")
    bad = _one(rule, slow, base)
    assert bad.present is True and bad.detail["ratio"] > 6
    assert _one(rule, same, base).present is False
    # Twice as slow but two values only: not enough to say anything -> more trials.
    assert _one(rule, [_trial([20.0, 21.0])], base).present is None
    # The good end itself only has to produce a measurement.
    assert _one(rule, same, None).present is False


def _seed_ends() -> tuple[list[Figures], list[Figures], list[Figures]]:
    """K3 at the good end (1024 tokens, ~10 ms/token, ~3.5 tokens per chunk), the capped build (same
    token ITL, 128 tokens) and a really slower build."""
    rng = np.random.default_rng(1)
    good = [_trial(list(rng.normal(10.3, 0.02, 8)), tokens=1024, per_chunk=3.5) for _ in range(3)]
    capped = [
        _trial(list(rng.normal(10.4, 0.02, 8)), tokens=128, per_chunk=3.5, truncated_below_max_tokens=8)
        for _ in range(3)
    ]
    slow = [_trial(list(rng.normal(25.0, 0.5, 8)), tokens=1024, per_chunk=3.5) for _ in range(3)]
    return good, capped, slow


def test_auto_names_the_cap_not_a_slowdown() -> None:
    good, capped, _ = _seed_ends()
    verdict = _one(Regress("auto"), capped, good, name="K3")
    assert verdict.present is True
    assert verdict.detail["signals"] == ["truncation"]
    text = verdict.detail["explanation"]
    assert text.startswith("outputs capped at 128 tokens (was 1024)")
    assert "token ITL unchanged (10.3 → 10.4 ms/token)" in text
    assert "chunk ITL is K3's (3.5 tokens per chunk) artefact" in text


def test_auto_names_a_real_slowdown_and_stays_quiet_on_the_good_end() -> None:
    good, _, slow = _seed_ends()
    verdict = _one(Regress("auto"), slow, good, name="K3")
    assert verdict.present is True and verdict.detail["signals"] == ["itl"]
    assert "token ITL up 2.4" in verdict.detail["explanation"]
    assert "outputs full length (1024 tokens)" in verdict.detail["explanation"]
    again = _one(Regress("auto"), good[1:], good[:1], name="K3")
    assert again.present is False and again.detail["signals"] == []


def test_auto_names_errors() -> None:
    good, _, _ = _seed_ends()
    broken = [_trial([10.3] * 6, errors=2, tokens=1024, stream_error=2)]
    verdict = _one(Regress("auto"), broken, good)
    assert verdict.present is True and verdict.detail["signals"] == ["errors"]
    assert "2 of 8 requests failed (was 0; stream_error×2)" in verdict.detail["explanation"]


def test_speedup_judges_the_k3_over_k0_ratio() -> None:
    rng = np.random.default_rng(2)

    def probe(k0: float, k3: float) -> dict[str, Figures]:
        return {
            "K0": Figures.pool([_trial(list(rng.normal(k0, 0.2, 8)))]),
            "K3": Figures.pool([_trial(list(rng.normal(k3, 0.2, 8)))]),
        }

    names = ["K0", "K3"]
    ref = probe(10.0, 4.0)  # speedup 2.5x
    lost = judge(Regress("speedup"), probe(10.0, 9.0), ref, names, threshold=T, alpha=A)
    assert lost.present is True and "speedup 2.5" in lost.reason
    # Both got slower together: the ratio holds, so MTP still pays off.
    kept = judge(Regress("speedup"), probe(20.0, 8.0), ref, names, threshold=T, alpha=A)
    assert kept.present is False


def test_script_exit_codes_follow_git_bisect_run() -> None:
    assert script_answer(0, "s") is False
    assert script_answer(1, "s") is True and script_answer(127, "s") is True
    assert script_answer(125, "s") is None
    with pytest.raises(BisectError, match="stopping the bisection"):
        script_answer(128, "s")
