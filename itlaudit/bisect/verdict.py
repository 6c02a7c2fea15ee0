"""What makes a probe bad: the `--regress` rule, applied to the trials' run folders.

Everything is read back from the run folders on disk (summary.json, requests.jsonl), never from
memory, so a resumed bisection judges its old probes exactly as the original run did. A rule answers
True (the problem is present), False (absent) or None (not clear yet: more trials, then unknown).
Timing rules never trust a ratio alone: the Mann-Whitney U test of itlaudit.stats must also say the
difference is real, because two cores running a server and a client make single runs noisy.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from itlaudit import findings, stats
from itlaudit.bisect.errors import BisectError
from itlaudit.records import load_records
from itlaudit.rundir import REQUESTS_FILE, SUMMARY_FILE
from itlaudit.summary import derive_request

MODES = ("itl", "truncation", "error")
TRUNCATION_CODES = frozenset(
    {
        findings.TRUNCATED_BELOW_MAX_TOKENS,
        findings.IGNORE_EOS_VIOLATED,
        findings.MIN_TOKENS_VIOLATED,
        findings.COMMON_CAP,
    }
)
ERROR_CODES = frozenset(
    {findings.STREAM_ERROR, findings.HTTP_ERROR, findings.CONNECTION_ERROR, findings.NO_DONE_SENTINEL}
)
# Fewer per-request ITL values than this and the U test cannot separate anything at alpha 0.05.
MIN_SAMPLES = 5
SCRIPT_SKIP = 125


@dataclass(frozen=True)
class Regress:
    """`mode` is itl, truncation, error, finding (with `code`) or script (with `script`)."""

    mode: str
    code: str | None = None
    script: str | None = None

    @property
    def timing(self) -> bool:
        return self.mode == "itl"

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
        raise BisectError(f"--regress {text!r}: use itl, truncation, error, finding:CODE, or --script CMD")
    return Regress(text)


@dataclass
class Trial:
    """The figures of one trial (one pass of the workload) that verdicts and reports need."""

    itl_ms: list[float]
    completion_tokens: list[int]
    requests: int
    errors: int
    findings: Counter[str] = field(default_factory=Counter)

    @property
    def finished(self) -> int:
        return self.requests - self.errors


def read_trial(run_dir: Path) -> Trial:
    summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    blocks = list(summary["variants"].values())
    itl: list[float] = []
    tokens: list[int] = []
    for record in load_records(run_dir / REQUESTS_FILE):
        figures = derive_request(record)  # raw lines carry no figures: derive them, never read copies
        if figures["itl_ms"] is not None:
            itl.append(float(figures["itl_ms"]))
        if record.completion_tokens is not None:
            tokens.append(int(record.completion_tokens))
    counts: Counter[str] = Counter()
    for block in blocks:
        counts.update(block["findings"])
    return Trial(
        itl_ms=itl,
        completion_tokens=tokens,
        requests=sum(b["requests"] for b in blocks),
        errors=sum(b["errors"] for b in blocks),
        findings=counts,
    )


def pooled_itl(trials: Sequence[Trial]) -> list[float]:
    return [v for t in trials for v in t.itl_ms]


def metrics(trials: Sequence[Trial]) -> dict[str, Any]:
    """The per-probe figures kept in bisect.json and plotted: medians over all trials' requests."""
    itl = pooled_itl(trials)
    tokens = [v for t in trials for v in t.completion_tokens]
    found: Counter[str] = Counter()
    for trial in trials:
        found.update(trial.findings)
    return {
        "itl_p50_ms": float(np.median(itl)) if itl else None,
        "completion_tokens_p50": float(np.median(tokens)) if tokens else None,
        "requests": sum(t.requests for t in trials),
        "errors": sum(t.errors for t in trials),
        "findings": dict(sorted(found.items())),
    }


@dataclass(frozen=True)
class Judgement:
    present: bool | None
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


def judge(
    regress: Regress,
    trials: Sequence[Trial],
    baseline: Sequence[float] | None,
    *,
    threshold: float,
    alpha: float,
) -> Judgement:
    """Apply the rule to the trials so far. `baseline` is the good end's pooled ITL; None while
    probing the good end itself, which only has to produce a measurement to count as good."""
    if regress.mode == "error":
        errors = sum(t.errors for t in trials) + sum(t.findings[c] for t in trials for c in ERROR_CODES)
        return Judgement(errors > 0, f"{errors} error(s)" if errors else "no errors")
    if not any(t.finished for t in trials):
        return Judgement(None, "no request finished")
    if regress.mode in ("truncation", "finding"):
        codes = TRUNCATION_CODES if regress.mode == "truncation" else frozenset({regress.code})
        hits = Counter({c: sum(t.findings[c] for t in trials) for c in codes})
        fired = {c: n for c, n in hits.items() if n}
        reason = ", ".join(f"{c}×{n}" for c, n in sorted(fired.items())) or f"no {regress.text} finding"
        return Judgement(bool(fired), reason, {"findings": fired})
    if regress.mode == "itl":
        return _judge_itl(pooled_itl(trials), baseline, threshold=threshold, alpha=alpha)
    raise BisectError(f"--regress {regress.text} is judged by its script, not here")


def _judge_itl(
    samples: list[float], baseline: Sequence[float] | None, *, threshold: float, alpha: float
) -> Judgement:
    if len(samples) < MIN_SAMPLES:
        return Judgement(None, f"only {len(samples)} ITL value(s); need {MIN_SAMPLES}")
    if baseline is None:
        return Judgement(False, f"reference: token ITL p50 {np.median(samples):.2f} ms")
    cmp = stats.compare_samples(
        list(baseline),
        samples,
        lower_is_better=True,
        threshold=threshold,
        alpha=alpha,
        min_samples=MIN_SAMPLES,
    )
    detail = {"ratio": cmp.ratio, "p_value": cmp.p_value, "stats_verdict": cmp.verdict}
    ratio = "n/a" if cmp.ratio is None else f"{cmp.ratio:.2f}×"
    reason = f"token ITL p50 {np.median(samples):.2f} ms, {ratio} the good end: {cmp.reason}"
    present = {stats.WORSE: True, stats.SAME: False, stats.BETTER: False}.get(cmp.verdict)
    return Judgement(present, reason, detail)


def script_answer(code: int, script: str) -> bool | None:
    """git bisect run's contract: 0 good, 125 skip, 1-127 bad, anything else stops the bisection."""
    if code == 0:
        return False
    if code == SCRIPT_SKIP:
        return None
    if 1 <= code <= 127:
        return True
    raise BisectError(f"--script {script!r} exited {code} (>127 or killed): stopping the bisection")
