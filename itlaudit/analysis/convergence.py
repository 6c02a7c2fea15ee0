"""When repeating a measurement has made its answer clear (`--trials auto`), pure.

Each trial gives one figure of the chosen metric (a variant's p50 token ITL, say). After every trial
the bootstrap confidence interval of their mean (scipy.stats.bootstrap, BCa where it can be computed,
else percentile) is compared with the stated width, relative to the mean: once it is within it, after
at least `min_trials`, more trials would only narrow an answer that is already clear; at `max_trials`
the loop stops either way and says the interval did not close. AIPerf's `--convergence-mode ci_width`
is the same rule.

The interval is of the mean of per-trial figures, so it measures how much the figure moves between
trials (server warm-up, noisy neighbours), not the spread of requests within one trial.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.schedule import LONGEST_SCHEDULE_S

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CI_WIDTH_PCT = 5.0  # the interval's full width as a % of the mean: a 5 % move stands out
DEFAULT_MIN_TRIALS = 3  # two figures bootstrap to an interval that says little about a third
DEFAULT_MAX_TRIALS = 10
_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A confidence interval of the mean of the trials' figures."""

    mean: float
    low: float
    high: float
    confidence: float
    trials: int

    @property
    def width_pct(self) -> float:
        """The full width as a % of the mean (inf for a mean of 0 with any width)."""
        width = self.high - self.low
        if width == 0:
            return 0.0
        return math.inf if self.mean == 0 else 100.0 * width / abs(self.mean)

    def to_json(self) -> JSONObject:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "trials": self.trials,
            "width_pct": self.width_pct,
        }

    def text(self, unit: str = "") -> str:
        """`12.31 ms [12.10, 12.52] (95% CI over 4 trials, 3.4 % wide)`, one line for a terminal or report."""
        return (
            f"{self.mean:.4g}{unit} [{self.low:.4g}, {self.high:.4g}] ({self.confidence:.0%} CI over "
            f"{self.trials} trials, {self.width_pct:.3g} % wide)"
        )


def mean_interval(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Interval | None:
    """The bootstrap interval of the mean of `values` (None for fewer than two finite ones). Equal
    values have an interval of no width (the bootstrap would divide by zero to say so)."""
    import numpy as np  # numpy and scipy load when trials are judged, not when the CLI starts

    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(data) < 2:
        return None
    mean = float(data.mean())
    if np.ptp(data) == 0:
        return Interval(mean, mean, mean, confidence, len(data))
    from scipy.stats import bootstrap  # scipy loads when trials are judged, not when the CLI starts

    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BCa's degenerate-sample warning: the percentile fallback below
        found = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=_RESAMPLES, rng=rng)
        low, high = found.confidence_interval.low, found.confidence_interval.high
        if not (math.isfinite(low) and math.isfinite(high)):
            found = bootstrap(
                (data,),
                np.mean,
                confidence_level=confidence,
                n_resamples=_RESAMPLES,
                rng=rng,
                method="percentile",
            )
            low, high = found.confidence_interval.low, found.confidence_interval.high
    return Interval(mean, float(low), float(high), confidence, len(data))


def median_ratio_interval(
    base: Sequence[float], new: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """The bootstrap interval (percentile, each side resampled on its own) of median(new) /
    median(base), the ratio `diff` reports beside its p-value; None with fewer than two finite
    values a side or a base median of 0."""
    import numpy as np

    b = np.asarray([v for v in base if v is not None and math.isfinite(v)], dtype=float)
    n = np.asarray([v for v in new if v is not None and math.isfinite(v)], dtype=float)
    if len(b) < 2 or len(n) < 2 or np.median(b) == 0:
        return None
    from scipy.stats import bootstrap

    def ratio(b_sample: np.ndarray, n_sample: np.ndarray, axis: int = -1) -> np.ndarray:
        low = np.median(b_sample, axis=axis)
        out: np.ndarray = np.median(n_sample, axis=axis) / np.where(low == 0, np.nan, low)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a resample with a 0 median: its nan is left out below
        found = bootstrap(
            (b, n),
            ratio,
            confidence_level=confidence,
            n_resamples=_RESAMPLES,
            method="percentile",
            batch=200,  # memory: 200 resamples of each side at a time, whatever the run's size
            rng=np.random.default_rng(seed),
        )
    low, high = found.confidence_interval.low, found.confidence_interval.high
    return (float(low), float(high)) if math.isfinite(low) and math.isfinite(high) else None


@dataclass(frozen=True)
class Progress:
    """Where the trials stand: stop or go on, why, and the interval so far."""

    done: bool
    converged: bool
    reason: str
    interval: Interval | None

    def to_json(self) -> JSONObject:
        return {
            "converged": self.converged,
            "reason": self.reason,
            "interval": self.interval.to_json() if self.interval is not None else None,
        }


@dataclass(frozen=True)
class ConvergenceRule:
    """Repeat until the interval of the mean is within `ci_width_pct` of it, between `min_trials`
    and `max_trials` trials."""

    ci_width_pct: float = DEFAULT_CI_WIDTH_PCT
    min_trials: int = DEFAULT_MIN_TRIALS
    max_trials: int = DEFAULT_MAX_TRIALS
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not 2 <= self.min_trials <= self.max_trials:
            raise ValueError("trials need 2 <= min_trials <= max_trials")
        if not (self.ci_width_pct > 0 and 0 < self.confidence < 1):
            raise ValueError("the width must be positive and the confidence within (0, 1)")

    def judge(self, figures: Sequence[float]) -> Progress:
        """After the trials so far (one figure each): stop once the interval is narrow enough over at
        least `min_trials` trials that gave a figure, or the maximum is reached. A trial with no figure
        (NaN: every request failed, or the trial was not comparable) counts against the maximum and
        never towards the minimum, so invalid trials cannot make an answer look clear."""
        trials = len(figures)
        valid = sum(1 for f in figures if math.isfinite(f))
        invalid = f" ({trials - valid} of them without a valid figure)" if valid < trials else ""
        interval = mean_interval(figures, self.confidence)
        narrow = interval is not None and interval.width_pct <= self.ci_width_pct
        if valid >= self.min_trials and narrow:
            assert interval is not None
            reason = (
                f"interval {interval.width_pct:.3g} % of the mean wide, within {self.ci_width_pct:g} %, "
                f"after {trials} trials{invalid}"
            )
            return Progress(True, True, reason, interval)
        if trials >= self.max_trials:
            if valid < self.min_trials:
                reason = (
                    f"{valid} valid figures in the maximum of {self.max_trials} trials{invalid}: too few "
                    f"to judge (at least {self.min_trials}); the trials' findings say why"
                )
                return Progress(True, False, reason, interval)
            width = f"{interval.width_pct:.3g} % wide" if interval is not None else "no interval"
            reason = (
                f"interval {width} after the maximum of {self.max_trials} trials{invalid}, not within "
                f"{self.ci_width_pct:g} %: the figure moves between trials more than the stated width"
            )
            return Progress(True, False, reason, interval)
        return Progress(False, False, f"{trials} of at most {self.max_trials} trials{invalid}", interval)


class ConvergenceSettings(TypedDict):
    """--trials auto's settings as a run or sweep keeps them (sweep-config.json's `convergence`):
    ConvergenceRule's fields, the metric its trials are judged on, and the idle time between them."""

    ci_width_pct: float
    min_trials: int
    max_trials: int
    metric: str
    cooldown_s: float


def trials_settings(
    trials: str, ci_width: float, max_trials: int, cooldown: float
) -> tuple[int, ConvergenceSettings | None]:
    """The --trials N|auto, --ci-width, --max-trials and --cooldown flags as (the most trials, the
    rule's settings or None for a fixed count); a bad one raises ValueError with its one line."""
    if trials != "auto":
        if not trials.isdigit() or int(trials) < 1:
            raise ValueError(f"--trials {trials}: must be a whole number of at least 1, or auto")
        return int(trials), None
    try:
        ConvergenceRule(ci_width_pct=ci_width, min_trials=DEFAULT_MIN_TRIALS, max_trials=max_trials)
    except ValueError as exc:
        raise ValueError(
            f"--trials auto: {exc} (--ci-width above 0, --max-trials at least {DEFAULT_MIN_TRIALS})"
        ) from None
    if not 0 <= cooldown <= LONGEST_SCHEDULE_S:
        raise ValueError(f"--cooldown {cooldown:g}: must be within [0, {LONGEST_SCHEDULE_S:g}] s")
    settings: ConvergenceSettings = {
        "ci_width_pct": ci_width,
        "min_trials": DEFAULT_MIN_TRIALS,
        "max_trials": max_trials,
        "metric": "itl_ms",
        "cooldown_s": cooldown,
    }
    return max_trials, settings
