"""What one probe measured, per variant, through the same metric and summary functions `itlaudit
report` uses: a trial just run is figured from its run folder's own derivation (the records and summary
it derived once), and a resumed bisection reads its old probes' trial folders back from disk, so it
judges them exactly as the original run did. The judges in verdict.py read these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import Validity, block_validity, mostly_gibberish
from itlaudit.model import codes
from itlaudit.model.records import RequestRecord
from itlaudit.store.jsonl import load_records
from itlaudit.store.rundir import REQUESTS_FILE

ERROR_CODES = frozenset(
    {codes.STREAM_ERROR, codes.HTTP_ERROR, codes.CONNECTION_ERROR, codes.NO_DONE_SENTINEL}
)


class ProbeFigures(TypedDict, total=False):
    """One variant's figures in a probe as bisect.json keeps them (its file form; block_validity reads
    it as it reads a summary.json block). Keys can be absent from a file an older itlaudit wrote."""

    itl_p50_ms: float | None
    chunk_itl_p50_ms: float | None
    tokens_per_chunk_p50: float | None
    completion_tokens_p50: float | None
    requests: int
    errors: int
    findings: dict[str, int]


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
        return sum(self.findings[c] for c in codes.TRUNCATION_CODES)

    @property
    def failures(self) -> int:
        return self.errors + sum(self.findings[c] for c in ERROR_CODES)

    def validity(self, base: Figures | None = None) -> Validity:
        """analysis.validity's rule on these figures: whether this variant may be ranked at all, its
        quality judged against `base`, the baseline variant's figures at the same build (None for the
        baseline itself)."""
        return block_validity(self.summary(), base=base.summary() if base is not None else None)

    @property
    def gibberish(self) -> bool:
        """Most requests' text looks like gibberish (analysis.validity.mostly_gibberish)."""
        return mostly_gibberish(self.summary())

    def summary(self) -> ProbeFigures:
        """The per-probe figures kept in bisect.json and plotted: medians over all trials' requests."""
        return {
            "itl_p50_ms": median(self.itl_ms),
            "chunk_itl_p50_ms": median(self.chunk_itl_ms),
            "tokens_per_chunk_p50": median(self.tokens_per_chunk),
            "completion_tokens_p50": median(self.completion_tokens),
            "requests": self.requests,
            "errors": self.errors,
            "findings": dict(sorted(self.findings.items())),
        }


def read_trial(run_dir: Path) -> dict[str, Figures]:
    """Every variant's figures in a finished trial folder, derived from its requests.jsonl by the
    functions that write summary.json (so the verdict and the report cannot disagree)."""
    records = load_records(run_dir / REQUESTS_FILE)
    return trial_figures(records, summarize_run(records))


def trial_figures(records: Sequence[RequestRecord], summary: RunSummary) -> dict[str, Figures]:
    """Every variant's figures in a trial: its records and the summary derived from them (the run
    folder's own derivation right after a trial, so its requests.jsonl is not read a second time)."""
    trials: dict[str, Figures] = {}
    for name, block in summary.variants.items():
        derived = [request_metrics(r) for r in records if r.variant == name]
        trials[name] = Figures(
            itl_ms=[m.itl_ms for m in derived if m.itl_ms is not None],
            completion_tokens=[m.completion_tokens for m in derived if m.completion_tokens is not None],
            requests=block.requests,
            errors=block.errors,
            findings=Counter(block.findings),
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


def median(values: Sequence[float]) -> float | None:
    """None for no values: a figure that was never measured is not a zero."""
    return float(np.median(values)) if len(values) else None
