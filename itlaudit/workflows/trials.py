"""`run --trials N|auto`: the whole scenario run again and again, each trial a normal run folder
(`<folder>/t<k>/`), until every variant's interval is clear (analysis.convergence) or the count is
reached; `<folder>/trials.json` keeps each variant's per-trial p50 token ITL, its interval and why the
trials stopped."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from itlaudit.analysis.convergence import ConvergenceRule, ConvergenceSettings, Progress, mean_interval
from itlaudit.analysis.validity import variant_validity
from itlaudit.model.scenario import Scenario
from itlaudit.store.rundir import DEFAULT_REPORTS, new_run_dir, write_versioned
from itlaudit.workflows.run import RunOutcome

TRIALS_FILE = "trials.json"
METRIC = "itl_ms"  # each trial's figure: a variant's p50 token ITL


@dataclass(frozen=True)
class TrialsOutcome:
    folder: Path
    outcomes: list[RunOutcome]
    progress: dict[str, Progress]  # per variant: the interval and why the trials stopped


def _figure(outcome: RunOutcome, variant: str) -> float:
    """The trial's figure for the variant; NaN (no figure) where the trial is not comparable (cut
    short, failed, gibberish the gate counts): a speed from outputs that were not whole is not one of
    the figures whose spread says the answer is clear."""
    summary = outcome.derivation.summary
    block = summary.variants.get(variant)
    value = None if block is None else block.itl_ms.get("p50")
    if not isinstance(value, int | float) or not variant_validity(summary, variant).comparable:
        return math.nan
    return float(value)


def _fixed(figures: list[float], count: int) -> Progress:
    """N fixed trials: the interval they reached, with no rule to meet."""
    interval = mean_interval(figures)
    return Progress(
        len(figures) >= count, False, f"{len(figures)} of {count} trials (a fixed count)", interval
    )


def run_trials(
    scenario: Scenario,
    run_one: Callable[[Path], RunOutcome],
    *,
    count: int,
    convergence: ConvergenceSettings | None,
    folder: Path | None = None,
) -> TrialsOutcome:
    """`run_one(trial_folder)` runs the scenario once; with `convergence` (cli's --trials auto
    settings) the trials stop once every variant's rule is met, at most `count` of them, with
    `cooldown_s` of idle server between them."""
    base = folder if folder is not None else new_run_dir(DEFAULT_REPORTS, f"{scenario.folder_name}-trials")
    base.mkdir(parents=True, exist_ok=True)
    rule = (
        ConvergenceRule(
            ci_width_pct=convergence["ci_width_pct"],
            min_trials=convergence["min_trials"],
            max_trials=convergence["max_trials"],
        )
        if convergence is not None
        else None
    )
    names = [v.name for v in scenario.variants]
    figures: dict[str, list[float]] = {name: [] for name in names}
    outcomes: list[RunOutcome] = []
    progress: dict[str, Progress] = {}
    for number in range(1, count + 1):
        if outcomes and convergence and convergence.get("cooldown_s"):
            time.sleep(convergence["cooldown_s"])
        outcome = run_one(base / f"t{number}")
        outcomes.append(outcome)
        for name in names:
            figures[name].append(_figure(outcome, name))
        progress = {
            name: rule.judge(figures[name]) if rule is not None else _fixed(figures[name], count)
            for name in names
        }
        write_versioned(
            base / TRIALS_FILE,
            {
                "metric": f"{METRIC} p50",
                "trials": [o.run_dir.name for o in outcomes],
                "variants": {name: {"figures": figures[name], **progress[name].to_json()} for name in names},
            },
        )
        if rule is not None and all(p.done for p in progress.values()):
            break
    return TrialsOutcome(base, outcomes, progress)
