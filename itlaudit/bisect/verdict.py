"""What makes a probe bad: the `--regress` rule as a Judge, applied to the trials' figures.

Each rule is a Judge registered by name in JUDGES (`--regress NAME[:ARG]`, or `--script CMD`): a new
rule is one class here. A judge answers True (the problem is present), False (absent) or None (not clear
yet: more trials, then unknown); the probe turns that into a Verdict. Timing judges never trust a ratio
alone: the Mann-Whitney U test of itlaudit.analysis.stats must also say the difference is real.

`auto` (the default) is the seed's lesson as a rule: a probe is bad when it differs from the good end
in token ITL (beyond the threshold and significant), in truncation findings, or in errors, and the
verdict names which of them flipped, with the figures, so a 128-token cap is never read as a slowdown
and multi-token chunks under MTP are never read as slow tokens.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from itlaudit.analysis import findings, stats
from itlaudit.bisect.explain import MIN_SAMPLES, explain, itl_comparison, itl_text, ms
from itlaudit.bisect.figures import Figures, median
from itlaudit.errors import BisectError
from itlaudit.model import codes
from itlaudit.model.jsonvalue import JSONMapping, ReadOnlyJSON
from itlaudit.model.registry import Registry
from itlaudit.model.vocabulary import Shift, Verdict

SCRIPT_SKIP = 125


@dataclass(frozen=True)
class Judgement:
    present: bool | None
    reason: str
    detail: JSONMapping = field(default_factory=dict)  # free-form per rule; "signals", "explanation" are read


@dataclass(frozen=True)
class Judge:
    """One `--regress` rule. The class attributes tell the probe how to run it: `timing` rules need
    several trials and cannot share a GPU with a prefetch; an `across_variants` rule is decided only
    once the last variant ran; `failed_server` is the verdict when the server would not start or
    stopped answering (the regression itself only under `error`)."""

    name: ClassVar[str]
    timing: ClassVar[bool] = False
    across_variants: ClassVar[bool] = False
    failed_server: ClassVar[Verdict] = Verdict.UNKNOWN
    # What the report plots per probe: the figure the verdict is about (key in the probe's figures, label).
    plotted: ClassVar[tuple[str, str]] = ("itl_p50_ms", "token ITL p50 (ms)")

    def __init_subclass__(cls, name: str = "", **kwargs: Any) -> None:
        """`class XJudge(Judge, name="x")` files the judge in JUDGES under `--regress x`."""
        super().__init_subclass__(**kwargs)
        if name:
            cls.name = name
            JUDGES.register(name)(cls)

    @classmethod
    def parse(cls, argument: str) -> Judge:
        """The judge for `--regress NAME:ARGUMENT`; most take no argument."""
        if argument:
            raise BisectError(f"--regress {cls.name}:{argument}: {cls.name} takes no argument")
        return cls()

    @property
    def text(self) -> str:
        """The rule as the user wrote it: what bisect.json, the report and the resume line carry."""
        return self.name

    def judge(
        self,
        probe: dict[str, Figures],
        ref: dict[str, Figures] | None,
        names: Sequence[str],
        *,
        threshold: float,
        alpha: float,
    ) -> Judgement:
        """The whole probe against the good end (`ref` None while probing the good end itself). With
        the good end's figures at hand the detail also carries the explanation in figures."""
        verdict = self.across(probe, ref, names, threshold=threshold, alpha=alpha)
        if ref is not None:
            texts = [
                (f"{name}: " if len(names) > 1 else "")
                + explain(name, probe[name], ref[name], threshold=threshold, alpha=alpha)
                for name in names
                if name in probe and name in ref
            ]
            verdict = dataclasses.replace(
                verdict, detail={**verdict.detail, "explanation": " · ".join(texts)}
            )
        return verdict

    def across(
        self,
        probe: dict[str, Figures],
        ref: dict[str, Figures] | None,
        names: Sequence[str],
        *,
        threshold: float,
        alpha: float,
    ) -> Judgement:
        """Bad when any variant is bad, good when every variant is good, else unclear."""
        per = {
            name: self.variant(probe[name], ref.get(name) if ref else None, threshold=threshold, alpha=alpha)
            for name in names
            if name in probe
        }
        answers = [j.present for j in per.values()]
        present = (
            True if True in answers else (False if answers and all(a is False for a in answers) else None)
        )
        reason = "; ".join(f"{n}: {j.reason}" if len(per) > 1 else j.reason for n, j in per.items())
        signals = sorted({s for j in per.values() for s in _named_signals(j.detail)})
        detail: dict[str, ReadOnlyJSON] = {"variants": {n: j.detail for n, j in per.items()}}
        if len(per) == 1:
            detail.update(next(iter(per.values())).detail)
        return Judgement(present, reason or "no variant ran", {**detail, "signals": signals})

    def variant(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        """One variant against the same variant at the good end; a probe where nothing finished has
        nothing to judge."""
        if not probe.finished:
            return Judgement(None, "no request finished")
        return self.finished(probe, ref, threshold=threshold, alpha=alpha)

    def finished(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        raise BisectError(f"--regress {self.text} is judged by its script or across variants, not here")


def _named_signals(detail: JSONMapping) -> list[str]:
    """The signals a judgement named (a list under "signals" when there are any)."""
    found = detail.get("signals")
    return [str(s) for s in found] if isinstance(found, list) else []


JUDGES: Registry[type[Judge]] = Registry(
    "--regress", BisectError, hint="finding takes a code (finding:CODE); script comes with --script CMD"
)


def parse_regress(text: str, script: str | None = None) -> Judge:
    """--script wins (it is the most specific thing a user can say); otherwise the named rule."""
    if script:
        return ScriptJudge(script)
    name, _, argument = text.partition(":")
    return JUDGES.get(name).parse(argument)


@dataclass(frozen=True)
class AutoJudge(Judge, name="auto"):
    timing: ClassVar[bool] = True

    def variant(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        if ref is not None and probe.failures > 0 and not ref.failures and not probe.finished:
            return Judgement(True, f"all {probe.requests} requests failed", {"signals": ["errors"]})
        return super().variant(probe, ref, threshold=threshold, alpha=alpha)

    def finished(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        if ref is None:
            return Judgement(False, _reference_text(probe))
        cmp = itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
        flipped = _signals(probe, ref, cmp)
        present = True if flipped else cmp.verdict.regressed
        reason = f"{', '.join(flipped) or 'no signal'} flipped; {itl_text(cmp)}"
        detail = {
            "signals": flipped,
            "ratio": cmp.ratio,
            "p_value": cmp.p_value,
            "stats_verdict": cmp.verdict,
        }
        return Judgement(present, reason, detail)


@dataclass(frozen=True)
class ItlJudge(Judge, name="itl"):
    timing: ClassVar[bool] = True

    def finished(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        if len(probe.itl_ms) < MIN_SAMPLES:
            return Judgement(None, f"only {len(probe.itl_ms)} ITL value(s); need {MIN_SAMPLES}")
        if ref is None:
            return Judgement(False, f"reference: token ITL p50 {np.median(probe.itl_ms):.2f} ms")
        cmp = itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
        detail = {"ratio": cmp.ratio, "p_value": cmp.p_value, "stats_verdict": cmp.verdict}
        ratio = "n/a" if cmp.ratio is None else f"{cmp.ratio:.2f}×"
        reason = f"token ITL p50 {np.median(probe.itl_ms):.2f} ms, {ratio} the good end: {cmp.reason}"
        present = cmp.verdict.regressed
        return Judgement(present, reason, detail)


@dataclass(frozen=True)
class SpeedupJudge(Judge, name="speedup"):
    """Bad when the second variant's token ITL over the first's (K3/K0) rose beyond the threshold,
    significantly, against the same ratio at the good end: MTP stopped paying off."""

    timing: ClassVar[bool] = True
    across_variants: ClassVar[bool] = True

    def across(
        self,
        probe: dict[str, Figures],
        ref: dict[str, Figures] | None,
        names: Sequence[str],
        *,
        threshold: float,
        alpha: float,
    ) -> Judgement:
        base, spec = names
        # The one validity rule: a capped or failing variant's ITL is no speed, so no speedup either.
        validity = {n: probe[n].validity(probe.get(base) if n != base else None) for n in names if n in probe}
        unlike = [f"{n} {v.label}" for n, v in validity.items() if not v.comparable]
        if unlike:
            return Judgement(None, "; ".join(unlike))
        samples = _normalised(probe[spec], probe[base]) if spec in probe and base in probe else []
        if len(samples) < MIN_SAMPLES:
            return Judgement(None, f"only {len(samples)} {spec} token ITL value(s) over a {base} median")
        ratio = float(np.median(samples))
        if ref is None:
            return Judgement(
                False, f"reference: {spec}/{base} token ITL {ratio:.2f} (speedup {1 / ratio:.2f}×)"
            )
        ref_samples = _normalised(ref[spec], ref[base])
        cmp = stats.compare_samples(
            ref_samples,
            samples,
            lower_is_better=True,
            threshold=threshold,
            alpha=alpha,
            min_samples=MIN_SAMPLES,
        )
        ref_ratio = cmp.base_median or float("nan")
        reason = (
            f"{spec}/{base} token ITL {ref_ratio:.2f} → {ratio:.2f} (speedup {1 / ref_ratio:.2f}× → "
            f"{1 / ratio:.2f}×): {cmp.reason}"
        )
        present = cmp.verdict.regressed
        detail = {
            "ratio": cmp.ratio,
            "p_value": cmp.p_value,
            "stats_verdict": cmp.verdict,
            "signals": ["speedup"],
        }
        return Judgement(present, reason, detail)


@dataclass(frozen=True)
class ErrorJudge(Judge, name="error"):
    failed_server: ClassVar[Verdict] = Verdict.BAD
    plotted: ClassVar[tuple[str, str]] = ("errors", "failed requests")

    def variant(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        return Judgement(probe.failures > 0, f"{probe.failures} error(s)" if probe.failures else "no errors")


@dataclass(frozen=True)
class _CodesJudge(Judge, ABC):
    """Bad when any of `codes` fired on the probe, whatever the good end did."""

    plotted: ClassVar[tuple[str, str]] = ("completion_tokens_p50", "completion tokens p50")

    @property
    @abstractmethod
    def codes(self) -> tuple[str, ...]: ...

    def finished(self, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
        fired = {c: probe.findings[c] for c in self.codes if probe.findings[c]}
        reason = ", ".join(f"{c}×{n}" for c, n in sorted(fired.items())) or f"no {self.text} finding"
        return Judgement(bool(fired), reason, {"findings": fired})


@dataclass(frozen=True)
class TruncationJudge(_CodesJudge, name="truncation"):
    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(codes.TRUNCATION_CODES)


@dataclass(frozen=True)
class FindingJudge(_CodesJudge, name="finding"):
    code: str

    @classmethod
    def parse(cls, argument: str) -> Judge:
        if argument not in findings.CODES:
            raise BisectError(
                f"--regress finding:{argument}: unknown finding code (known: {', '.join(findings.CODES)})"
            )
        return cls(argument)

    @property
    def text(self) -> str:
        return f"finding:{self.code}"

    @property
    def codes(self) -> tuple[str, ...]:
        return (self.code,)


@dataclass(frozen=True)
class ScriptJudge(Judge, name="script"):
    """`--script CMD`: run after the last variant with the probe folder; its exit code is the answer."""

    script: str

    @classmethod
    def parse(cls, argument: str) -> Judge:
        if not argument:
            raise BisectError("--regress script needs its command: give --script CMD")
        return cls(argument)

    def answer(self, code: int) -> bool | None:
        """git bisect run's contract: 0 good, 125 skip, 1-127 bad, anything else stops the bisection."""
        if code == 0:
            return False
        if code == SCRIPT_SKIP:
            return None
        if 1 <= code <= 127:
            return True
        raise BisectError(f"--script {self.script!r} exited {code} (>127 or killed): stopping the bisection")


def _signals(probe: Figures, ref: Figures, cmp: stats.Comparison) -> list[str]:
    flipped = []
    if probe.failures and not ref.failures:
        flipped.append("errors")
    if probe.truncated and not ref.truncated:
        flipped.append("truncation")
    # Quality, relative to the good end (analysis.validity's rule): text broken where it was clean
    # (seed 003); a dummy-weight build range writes gibberish at both ends and is bisected by speed.
    if probe.gibberish and not ref.gibberish:
        flipped.append("gibberish")
    if cmp.verdict == Shift.WORSE:
        flipped.append("itl")
    return flipped


def _reference_text(probe: Figures) -> str:
    summary = probe.summary()
    return (
        f"reference: token ITL p50 {ms(summary['itl_p50_ms'])} ms, chunk ITL p50 "
        f"{ms(summary['chunk_itl_p50_ms'])} ms, {ms(summary['completion_tokens_p50'])} tokens"
    )


def _normalised(spec: Figures, base: Figures) -> list[float]:
    """The spec variant's per-request token ITL in units of the base variant's median at the same
    build: the speedup's inverse per request, so the U test can judge a ratio."""
    base_median = median(base.itl_ms)
    return [v / base_median for v in spec.itl_ms] if base_median else []
