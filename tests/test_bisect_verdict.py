"""Verdict rules on synthetic figures: findings, errors, timing with the U test, auto's flipped
signals and their explanation, the K3/K0 speedup, script exit codes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from itlaudit.analysis.findings import TRUNCATION_CODES
from itlaudit.bisect.figures import Figures
from itlaudit.bisect.verdict import JUDGES, Judge, ScriptJudge, parse_regress
from itlaudit.errors import BisectError
from itlaudit.model.vocabulary import Verdict

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


def _one(regress: Judge, trials: list[Figures], ref: list[Figures] | None = None, name: str = "K0"):
    reference = {name: Figures.pool(ref)} if ref is not None else None
    return regress.judge({name: Figures.pool(trials)}, reference, [name], threshold=T, alpha=A)


def test_truncation_and_finding_rules() -> None:
    capped = _trial([1.0] * 3, truncated_below_max_tokens=3, common_cap=1)
    clean = _trial([1.0] * 3)
    assert _one(parse_regress("truncation"), [capped]).present is True
    assert _one(parse_regress("truncation"), [clean]).present is False
    assert _one(parse_regress("finding:common_cap"), [capped]).reason == "common_cap×1"
    nothing = Figures([], [], requests=3, errors=3)
    assert _one(parse_regress("truncation"), [nothing]).present is None


def test_error_rule_counts_failed_requests_and_error_findings() -> None:
    assert _one(parse_regress("error"), [_trial([1.0], errors=1)]).present
    assert _one(parse_regress("error"), [_trial([1.0], stream_error=1)]).present
    assert not _one(parse_regress("error"), [_trial([1.0] * 3)]).present


def test_itl_needs_significance_and_the_threshold() -> None:
    rng = np.random.default_rng(0)
    base = [_trial(list(rng.normal(10, 0.5, 12)))]
    slow = [_trial(list(rng.normal(72, 3, 4))) for _ in range(3)]
    same = [_trial(list(rng.normal(10.3, 0.5, 4))) for _ in range(3)]
    rule = parse_regress("itl")
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
    verdict = _one(parse_regress("auto"), capped, good, name="K3")
    assert verdict.present is True
    assert verdict.detail["signals"] == ["truncation"]
    text = verdict.detail["explanation"]
    assert text.startswith("outputs capped at 128 tokens (was 1024)")
    assert "token ITL unchanged (10.3 → 10.4 ms/token)" in text
    assert "chunk ITL is K3's (3.5 tokens per chunk) artefact" in text


def test_auto_names_a_real_slowdown_and_stays_quiet_on_the_good_end() -> None:
    good, _, slow = _seed_ends()
    verdict = _one(parse_regress("auto"), slow, good, name="K3")
    assert verdict.present is True and verdict.detail["signals"] == ["itl"]
    assert "token ITL up 2.4" in verdict.detail["explanation"]
    assert "outputs full length (1024 tokens)" in verdict.detail["explanation"]
    again = _one(parse_regress("auto"), good[1:], good[:1], name="K3")
    assert again.present is False and again.detail["signals"] == []


def test_auto_names_errors() -> None:
    good, _, _ = _seed_ends()
    broken = [_trial([10.3] * 6, errors=2, tokens=1024, stream_error=2)]
    verdict = _one(parse_regress("auto"), broken, good)
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
    lost = parse_regress("speedup").judge(probe(10.0, 9.0), ref, names, threshold=T, alpha=A)
    assert lost.present is True and "speedup 2.5" in lost.reason
    # Both got slower together: the ratio holds, so MTP still pays off.
    kept = parse_regress("speedup").judge(probe(20.0, 8.0), ref, names, threshold=T, alpha=A)
    assert kept.present is False


def test_script_exit_codes_follow_git_bisect_run() -> None:
    script = ScriptJudge("s")
    assert script.answer(0) is False
    assert script.answer(1) is True and script.answer(127) is True
    assert script.answer(125) is None
    with pytest.raises(BisectError, match="stopping the bisection"):
        script.answer(128)


def test_judges_are_registered_by_the_name_regress_takes() -> None:
    assert set(JUDGES) == {"auto", "itl", "speedup", "truncation", "error", "finding", "script"}
    for name in ("auto", "itl", "speedup", "truncation", "error"):
        assert parse_regress(name).text == name
    assert parse_regress("finding:common_cap").text == "finding:common_cap"
    assert parse_regress("auto", "check.sh") == ScriptJudge("check.sh")
    assert parse_regress("script:check.sh") == ScriptJudge("check.sh")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "speed",
            "--regress 'speed': use one of auto, itl, speedup, error, truncation, finding, script; "
            "finding takes a code (finding:CODE); script comes with --script CMD",
        ),
        ("itl:5", "--regress itl:5: itl takes no argument"),
        ("script", "--regress script needs its command: give --script CMD"),
    ],
)
def test_unknown_or_malformed_regress_is_one_line(text: str, message: str) -> None:
    with pytest.raises(BisectError) as caught:
        parse_regress(text)
    assert str(caught.value) == message


def test_server_failure_is_bad_only_for_the_error_rule() -> None:
    assert parse_regress("error").failed_server is Verdict.BAD
    assert parse_regress("auto").failed_server is Verdict.UNKNOWN
    assert parse_regress("truncation").failed_server is Verdict.UNKNOWN


def test_truncation_judge_reads_analysis_truncation_codes() -> None:
    """One definition of truncated: every code analysis calls truncation makes the judge fire."""
    for code in TRUNCATION_CODES:
        assert _one(parse_regress("truncation"), [_trial([1.0] * 3, **{code: 1})]).present is True


def test_bisect_png_draws_the_signal_that_flipped() -> None:
    """--regress auto that found a cap plots output length (its flipped signal), not token ITL; a
    slowdown, or a rule of one figure, plots that figure (issue 36 item 6)."""
    from itlaudit.bisect.build_range import Build
    from itlaudit.bisect.report import plotted_figure
    from itlaudit.bisect.settings import Settings
    from itlaudit.bisect.state import BisectResult, State

    def plotted(regress: str, signals: list[str]) -> str:
        builds = [Build("a1", "commit"), Build("b2", "commit")]
        state = State(Settings(good="a1", bad="b2", regress=parse_regress(regress)), builds)
        state.result = BisectResult(signals=signals)
        return plotted_figure(state)[0]

    assert plotted("auto", ["truncation"]) == "completion_tokens_p50"
    assert plotted("auto", ["errors"]) == "errors"
    assert plotted("auto", ["truncation", "itl"]) == "itl_p50_ms"
    assert plotted("auto", []) == "itl_p50_ms"
    assert plotted("truncation", []) == "completion_tokens_p50"
