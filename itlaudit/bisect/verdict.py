"""What makes a probe bad: the `--regress` rule, applied to the trials' run folders.

Everything is read back from the run folders on disk (requests.jsonl, through the same metric and
summary functions `itlaudit report` uses), never from memory, so a resumed bisection judges its old
probes exactly as the original run did. A rule answers True (the problem is present), False (absent)
or None (not clear yet: more trials, then unknown). Timing rules never trust a ratio alone: the
Mann-Whitney U test of itlaudit.analysis.stats must also say the difference is real.

`auto` (the default) is the seed's lesson as a rule: a probe is bad when it differs from the good end
in token ITL (beyond the threshold and significant), in truncation findings, or in errors, and the
verdict names which of them flipped, with the figures, so a 128-token cap is never read as a slowdown
and multi-token chunks under MTP are never read as slow tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from itlaudit.analysis import findings, stats
from itlaudit.analysis.derive import run_summary
from itlaudit.analysis.metrics import request_metrics
from itlaudit.errors import BisectError
from itlaudit.store.jsonl import load_records
from itlaudit.store.rundir import REQUESTS_FILE

MODES = ("auto", "itl", "speedup", "truncation", "error")
TIMING_MODES = frozenset({"auto", "itl", "speedup"})
ERROR_CODES = frozenset(
    {findings.STREAM_ERROR, findings.HTTP_ERROR, findings.CONNECTION_ERROR, findings.NO_DONE_SENTINEL}
)
# Fewer per-request ITL values than this and the U test cannot separate anything at alpha 0.05.
MIN_SAMPLES = 5
SCRIPT_SKIP = 125
# Chunk ITL this much above token ITL means chunks carry several tokens (MTP / spec decode): the chunk
# figure is then worth explaining rather than quoting.
CHUNK_INFLATION = 1.2


@dataclass(frozen=True)
class Regress:
    """`mode` is auto, itl, speedup, truncation, error, finding (with `code`) or script (with `script`)."""

    mode: str
    code: str | None = None
    script: str | None = None

    @property
    def timing(self) -> bool:
        return self.mode in TIMING_MODES

    @property
    def text(self) -> str:
        return f"finding:{self.code}" if self.mode == "finding" else self.mode


def parse_regress(text: str, script: str | None = None) -> Regress:
    """--script wins (it is the most specific thing a user can say); otherwise one of the rules."""
    if script:
        return Regress("script", script=script)
    name, _, code = text.partition(":")
    if name == "finding":
        if code not in findings.CODES:
            raise BisectError(
                f"--regress finding:{code}: unknown finding code (known: {', '.join(findings.CODES)})"
            )
        return Regress("finding", code=code)
    if text not in MODES:
        raise BisectError(
            f"--regress {text!r}: use auto, itl, speedup, truncation, error, finding:CODE, or --script CMD"
        )
    return Regress(text)


@dataclass
class Figures:
    """One variant's per-request figures from one trial, or from several pooled: what every rule and
    the explanation read."""

    itl_ms: list[float]
    completion_tokens: list[int]
    requests: int
    errors: int
    findings: Counter[str] = field(default_factory=Counter)
    chunk_itl_ms: list[float] = field(default_factory=list)
    tokens_per_chunk: list[float] = field(default_factory=list)

    @classmethod
    def pool(cls, trials: Sequence[Figures]) -> Figures:
        found: Counter[str] = Counter()
        for trial in trials:
            found.update(trial.findings)
        return cls(
            itl_ms=[v for t in trials for v in t.itl_ms],
            chunk_itl_ms=[v for t in trials for v in t.chunk_itl_ms],
            tokens_per_chunk=[v for t in trials for v in t.tokens_per_chunk],
            completion_tokens=[v for t in trials for v in t.completion_tokens],
            requests=sum(t.requests for t in trials),
            errors=sum(t.errors for t in trials),
            findings=found,
        )

    @property
    def finished(self) -> int:
        return self.requests - self.errors

    @property
    def truncated(self) -> int:
        return sum(self.findings[c] for c in findings.TRUNCATION_CODES)

    @property
    def failures(self) -> int:
        return self.errors + sum(self.findings[c] for c in ERROR_CODES)

    def summary(self) -> dict[str, Any]:
        """The per-probe figures kept in bisect.json and plotted: medians over all trials' requests."""
        return {
            "itl_p50_ms": _median(self.itl_ms),
            "chunk_itl_p50_ms": _median(self.chunk_itl_ms),
            "tokens_per_chunk_p50": _median(self.tokens_per_chunk),
            "completion_tokens_p50": _median(self.completion_tokens),
            "requests": self.requests,
            "errors": self.errors,
            "findings": dict(sorted(self.findings.items())),
        }


def read_trial(run_dir: Path) -> dict[str, Figures]:
    """Every variant's figures in a trial folder, derived from its requests.jsonl by the functions
    that write summary.json (so the verdict and the report cannot disagree)."""
    records = load_records(run_dir / REQUESTS_FILE)
    summary = run_summary(records)
    trials: dict[str, Figures] = {}
    for name, block in summary["variants"].items():
        derived = [request_metrics(r) for r in records if r.variant == name]
        trials[name] = Figures(
            itl_ms=[m.itl_ms for m in derived if m.itl_ms is not None],
            completion_tokens=[m.completion_tokens for m in derived if m.completion_tokens is not None],
            requests=int(block["requests"]),
            errors=int(block["errors"]),
            findings=Counter(block["findings"]),
            chunk_itl_ms=[m.chunk_itl_ms for m in derived if m.chunk_itl_ms is not None],
            tokens_per_chunk=[
                m.decode_tokens_per_chunk for m in derived if m.decode_tokens_per_chunk is not None
            ],
        )
    return trials


def read_probe(probe_dir: Path) -> dict[str, Figures]:
    """A finished probe's figures per variant, pooled over its trial folders."""
    per_variant: dict[str, list[Figures]] = {}
    for trial_dir in sorted(probe_dir.glob("trial-*"), key=lambda p: int(p.name.split("-")[1])):
        for name, trial in read_trial(trial_dir).items():
            per_variant.setdefault(name, []).append(trial)
    return {name: Figures.pool(trials) for name, trials in per_variant.items()}


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


@dataclass(frozen=True)
class Judgement:
    present: bool | None
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _itl_comparison(ref: Figures, probe: Figures, *, threshold: float, alpha: float) -> stats.Comparison:
    return stats.compare_samples(
        ref.itl_ms,
        probe.itl_ms,
        lower_is_better=True,
        threshold=threshold,
        alpha=alpha,
        min_samples=MIN_SAMPLES,
    )


def _itl_text(cmp: stats.Comparison) -> str:
    figures = f"{_ms(cmp.base_median)} → {_ms(cmp.new_median)} ms/token"
    if cmp.base_median is None or cmp.new_median is None:
        return "no token ITL to compare"
    if cmp.verdict == stats.WORSE:
        return f"token ITL up {cmp.ratio:.2f}× ({figures}, p = {cmp.p_value:.2g})"
    if cmp.verdict == stats.BETTER:
        return f"token ITL down ({figures}, p = {cmp.p_value:.2g})"
    if cmp.verdict == stats.SAME:
        return f"token ITL unchanged ({figures})"
    return f"token ITL unclear ({figures}: {cmp.reason})"


def explain(variant: str, probe: Figures, ref: Figures, *, threshold: float, alpha: float) -> str:
    """What changed against the good end, in figures: output length, errors, token ITL, and why a
    chunk ITL that looks slow is not (the seed's 72 ms was a 128-token cap read through K3 chunks)."""
    parts: list[str] = []
    tokens, ref_tokens = _median(probe.completion_tokens), _median(ref.completion_tokens)
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
    cmp = _itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
    parts.append(_itl_text(cmp))
    chunk, token = _median(probe.chunk_itl_ms), _median(probe.itl_ms)
    ref_chunk = _median(ref.chunk_itl_ms)
    if chunk is not None and token and cmp.verdict != stats.WORSE:
        causes = []
        if capped and ref_chunk and chunk / ref_chunk >= threshold:
            causes.append("the cap's")
        per_chunk = _median(probe.tokens_per_chunk) or 1.0
        if chunk / token > CHUNK_INFLATION:
            causes.append(f"{variant}'s ({per_chunk:.1f} tokens per chunk)")
        if causes:
            parts.append(f"the {_ms(chunk)} ms chunk ITL is {' and '.join(causes)} artefact")
    return "; ".join(parts)


def _signals(probe: Figures, ref: Figures, cmp: stats.Comparison) -> list[str]:
    flipped = []
    if probe.failures and not ref.failures:
        flipped.append("errors")
    if probe.truncated and not ref.truncated:
        flipped.append("truncation")
    if cmp.verdict == stats.WORSE:
        flipped.append("itl")
    return flipped


def _reference_text(probe: Figures) -> str:
    summary = probe.summary()
    return (
        f"reference: token ITL p50 {_ms(summary['itl_p50_ms'])} ms, chunk ITL p50 "
        f"{_ms(summary['chunk_itl_p50_ms'])} ms, {_ms(summary['completion_tokens_p50'])} tokens"
    )


def judge_variant(
    regress: Regress, probe: Figures, ref: Figures | None, *, threshold: float, alpha: float
) -> Judgement:
    """One variant's figures against the same variant at the good end (`ref` is None while probing the
    good end itself, which only has to produce a measurement to count as good)."""
    if regress.mode == "error":
        return Judgement(probe.failures > 0, f"{probe.failures} error(s)" if probe.failures else "no errors")
    errors_flipped = ref is not None and probe.failures > 0 and not ref.failures
    if regress.mode == "auto" and errors_flipped and not probe.finished:
        return Judgement(True, f"all {probe.requests} requests failed", {"signals": ["errors"]})
    if not probe.finished:
        return Judgement(None, "no request finished")
    if regress.mode in ("truncation", "finding"):
        codes = findings.TRUNCATION_CODES if regress.mode == "truncation" else (regress.code,)
        fired = {c: probe.findings[c] for c in codes if probe.findings[c]}
        reason = ", ".join(f"{c}×{n}" for c, n in sorted(fired.items())) or f"no {regress.text} finding"
        return Judgement(bool(fired), reason, {"findings": fired})
    if regress.mode == "itl":
        return _judge_itl(probe, ref, threshold=threshold, alpha=alpha)
    if regress.mode == "auto":
        if ref is None:
            return Judgement(False, _reference_text(probe))
        cmp = _itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
        flipped = _signals(probe, ref, cmp)
        present = True if flipped else {stats.SAME: False, stats.BETTER: False}.get(cmp.verdict)
        reason = f"{', '.join(flipped) or 'no signal'} flipped; {_itl_text(cmp)}"
        detail = {
            "signals": flipped,
            "ratio": cmp.ratio,
            "p_value": cmp.p_value,
            "stats_verdict": cmp.verdict,
        }
        return Judgement(present, reason, detail)
    raise BisectError(f"--regress {regress.text} is judged by its script or across variants, not here")


def _judge_itl(probe: Figures, ref: Figures | None, *, threshold: float, alpha: float) -> Judgement:
    if len(probe.itl_ms) < MIN_SAMPLES:
        return Judgement(None, f"only {len(probe.itl_ms)} ITL value(s); need {MIN_SAMPLES}")
    if ref is None:
        return Judgement(False, f"reference: token ITL p50 {np.median(probe.itl_ms):.2f} ms")
    cmp = _itl_comparison(ref, probe, threshold=threshold, alpha=alpha)
    detail = {"ratio": cmp.ratio, "p_value": cmp.p_value, "stats_verdict": cmp.verdict}
    ratio = "n/a" if cmp.ratio is None else f"{cmp.ratio:.2f}×"
    reason = f"token ITL p50 {np.median(probe.itl_ms):.2f} ms, {ratio} the good end: {cmp.reason}"
    present = {stats.WORSE: True, stats.SAME: False, stats.BETTER: False}.get(cmp.verdict)
    return Judgement(present, reason, detail)


def _normalised(spec: Figures, base: Figures) -> list[float]:
    """The spec variant's per-request token ITL in units of the base variant's median at the same
    build: the speedup's inverse per request, so the U test can judge a ratio."""
    median = _median(base.itl_ms)
    return [v / median for v in spec.itl_ms] if median else []


def judge_speedup(
    names: Sequence[str],
    probe: dict[str, Figures],
    ref: dict[str, Figures] | None,
    *,
    threshold: float,
    alpha: float,
) -> Judgement:
    """Bad when the second variant's token ITL over the first's (K3/K0) rose beyond the threshold,
    significantly, against the same ratio at the good end: MTP stopped paying off."""
    base, spec = names
    samples = _normalised(probe[spec], probe[base]) if spec in probe and base in probe else []
    if len(samples) < MIN_SAMPLES:
        return Judgement(None, f"only {len(samples)} {spec} token ITL value(s) over a {base} median")
    ratio = float(np.median(samples))
    if ref is None:
        return Judgement(False, f"reference: {spec}/{base} token ITL {ratio:.2f} (speedup {1 / ratio:.2f}×)")
    ref_samples = _normalised(ref[spec], ref[base])
    cmp = stats.compare_samples(
        ref_samples, samples, lower_is_better=True, threshold=threshold, alpha=alpha, min_samples=MIN_SAMPLES
    )
    ref_ratio = cmp.base_median or float("nan")
    reason = (
        f"{spec}/{base} token ITL {ref_ratio:.2f} → {ratio:.2f} (speedup {1 / ref_ratio:.2f}× → "
        f"{1 / ratio:.2f}×): {cmp.reason}"
    )
    present = {stats.WORSE: True, stats.SAME: False, stats.BETTER: False}.get(cmp.verdict)
    detail = {
        "ratio": cmp.ratio,
        "p_value": cmp.p_value,
        "stats_verdict": cmp.verdict,
        "signals": ["speedup"],
    }
    return Judgement(present, reason, detail)


def judge(
    regress: Regress,
    probe: dict[str, Figures],
    ref: dict[str, Figures] | None,
    names: Sequence[str],
    *,
    threshold: float,
    alpha: float,
) -> Judgement:
    """The whole probe: bad when any variant is bad, good when every variant is good, else unclear.
    With the good end's figures at hand the detail also carries the explanation in figures."""
    if regress.mode == "speedup":
        verdict = judge_speedup(names, probe, ref, threshold=threshold, alpha=alpha)
    else:
        per = {
            name: judge_variant(
                regress, probe[name], ref.get(name) if ref else None, threshold=threshold, alpha=alpha
            )
            for name in names
            if name in probe
        }
        answers = [j.present for j in per.values()]
        present = (
            True if True in answers else (False if answers and all(a is False for a in answers) else None)
        )
        reason = "; ".join(f"{n}: {j.reason}" if len(per) > 1 else j.reason for n, j in per.items())
        signals = sorted({s for j in per.values() for s in j.detail.get("signals", [])})
        detail: dict[str, Any] = {"variants": {n: j.detail for n, j in per.items()}}
        if len(per) == 1:
            detail.update(next(iter(per.values())).detail)
        verdict = Judgement(present, reason or "no variant ran", {**detail, "signals": signals})
    if ref is not None:
        texts = [
            (f"{name}: " if len(names) > 1 else "")
            + explain(name, probe[name], ref[name], threshold=threshold, alpha=alpha)
            for name in names
            if name in probe and name in ref
        ]
        verdict.detail["explanation"] = " · ".join(texts)
    return verdict


def script_answer(code: int, script: str) -> bool | None:
    """git bisect run's contract: 0 good, 125 skip, 1-127 bad, anything else stops the bisection."""
    if code == 0:
        return False
    if code == SCRIPT_SKIP:
        return None
    if 1 <= code <= 127:
        return True
    raise BisectError(f"--script {script!r} exited {code} (>127 or killed): stopping the bisection")
