"""Open-loop arrival schedules: when each request of a variant is due, computed up front and pure.

The same seed gives the same send times, so two variants (or two runs) of a scenario see the same
arrival pattern; the capture workers only wait for each request's offset, they draw nothing.

The intervals follow vllm bench serve's `get_request` (vllm/benchmarks/serve.py) so a scenario can
reproduce its `--request-rate R --burstiness B`: interval i ~ Gamma(shape=B, scale=1/(r_i·B)), mean
1/r_i and coefficient of variation 1/sqrt(B) (B = 1 is a Poisson process); the first request waits one
interval too. Without a ramp the cumulative offsets are rescaled so the last one is exactly n/R, as
vLLM does, so the run's mean rate does not depend on the seed. A linear ramp sets r_i from start_rate
to end_rate by request index (vLLM's `--ramp-up-strategy linear`), without that rescaling.

A timed trace (`[workload.dataset] kind = "trace"`) brings its own schedule instead: request i is due
at its timestamp less the first one, times `trace_scale` (vllm bench serve's `--self-timed` replay of
`timed_trace`, whose `--timed-trace-sec-multiplier` is the same factor), and no seed enters it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

LONGEST_SCHEDULE_S = 86_400.0  # a day: the longest schedule (or duration, or wait) a scenario may set
# How long streams still open at duration_s may go on before they are cut (status timeout, limit
# duration_cut_s): AIPerf's default --benchmark-grace-period, the same rule under the same name.
DURATION_GRACE_S = 30.0


@dataclass(frozen=True)
class RampUp:
    start_rate: float
    end_rate: float


@dataclass(frozen=True)
class Arrivals:
    """[workload] arrival keys. `request_rate` None (and no ramp) is the closed loop at `concurrency`."""

    request_rate: float | None = None
    burstiness: float = 1.0
    ramp_up: RampUp | None = None
    duration_s: float | None = None
    duration_grace_s: float = DURATION_GRACE_S
    warmup_requests: int = 0
    trace_s: tuple[float, ...] | None = None  # a timed trace: each entry's due time, from the first's
    trace_scale: float = 1.0  # the trace's intervals times this: 0.5 replays it twice as fast

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None or self.ramp_up is not None or self.trace_s is not None

    @property
    def cut_after_s(self) -> float | None:
        """When, from the measured phase's start, a stream still open is cut: duration_s + its grace."""
        return self.duration_s + self.duration_grace_s if self.duration_s is not None else None

    def mean_rate(self) -> float | None:
        if self.trace_s is not None:
            span = self.trace_s[-1] * self.trace_scale
            return len(self.trace_s) / span if span > 0 else None
        if self.ramp_up is not None:
            return (self.ramp_up.start_rate + self.ramp_up.end_rate) / 2
        return self.request_rate


def request_rates(count: int, arrivals: Arrivals) -> np.ndarray:
    """The rate each request's interval is drawn at (requests/s)."""
    import numpy as np  # numpy loads when a schedule is drawn, not when the CLI starts

    if arrivals.ramp_up is not None:
        progress = np.arange(count) / max(count - 1, 1)
        ramp = arrivals.ramp_up
        return ramp.start_rate + (ramp.end_rate - ramp.start_rate) * progress
    if arrivals.request_rate is None:
        raise ValueError("a closed loop has no arrival schedule")
    return np.full(count, float(arrivals.request_rate))


def expected_span_s(count: int, arrivals: Arrivals) -> float:
    """When the count-th request of a schedule is due, on average (the sum of its mean intervals),
    without drawing it: a linear ramp's mean interval over the requests is ln(end/start)/(end-start)."""
    if count == 0:
        return 0.0
    if arrivals.trace_s is not None:
        return trace_offsets_s(count, arrivals)[-1]
    if arrivals.ramp_up is None:
        if arrivals.request_rate is None:
            raise ValueError("a closed loop has no arrival schedule")
        return count / arrivals.request_rate
    start, end = arrivals.ramp_up.start_rate, arrivals.ramp_up.end_rate
    if count == 1 or math.isclose(start, end):
        return count / start
    return count * math.log(end / start) / (end - start)


def send_offsets_s(count: int, arrivals: Arrivals, seed: int) -> list[float]:
    """Seconds from the run's start at which request i (warmup first) is due."""
    if count == 0:
        return []
    if arrivals.trace_s is not None:
        return trace_offsets_s(count, arrivals)
    import numpy as np

    rates = request_rates(count, arrivals)
    shape = arrivals.burstiness
    rng = np.random.default_rng(seed)
    intervals = 1.0 / rates if np.isinf(shape) else rng.gamma(shape=shape, scale=1.0 / (rates * shape))
    offsets = np.cumsum(intervals)
    if arrivals.ramp_up is None and offsets[-1] > 0:
        offsets *= (count / float(arrivals.request_rate or 1.0)) / offsets[-1]
    return [float(v) for v in offsets]


def trace_offsets_s(count: int, arrivals: Arrivals) -> list[float]:
    """A timed trace's first `count` due times, scaled; a count past the trace's end is refused when
    the scenario is read (`parse_workload`), so this never has to invent arrivals."""
    if arrivals.trace_s is None or count > len(arrivals.trace_s):
        raise ValueError("a trace schedule covers at most the trace's own requests")
    return [t * arrivals.trace_scale for t in arrivals.trace_s[:count]]
