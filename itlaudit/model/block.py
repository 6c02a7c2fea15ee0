"""What the end-of-run block reports, as vllm bench serve's flags choose it: the goodput SLOs
(`--goodput`), the percentiles (`--metric-percentiles`) and the metrics they are given for
(`--percentile-metrics`).

One reading of each for every command and the scenario file, so `--goodput tpot:20` (vllm bench's
spelling) and `--goodput tpot_ms=20` (itlaudit's) are the same SLO on run, compare and sweep, and a
pasted vllm bench line reports what it reported there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from itlaudit.errors import ScenarioError
from itlaudit.model.meta import Meta

GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
# vllm bench's SLO names (its --goodput KEY:VALUE) for itlaudit's.
_VLLM_GOODPUT = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "e2el_ms": "e2e_ms"}
_SLO = re.compile(r"^\s*([a-z0-9_]+)\s*[:=]\s*(\S+)\s*$")
# The metrics the block gives percentiles for, by vllm bench's names, in its order; all four unless
# --percentile-metrics names fewer (vllm bench's own default leaves e2el out).
BLOCK_METRICS = ("ttft", "tpot", "itl", "e2el")
# The block's percentiles beside mean and median: vllm bench's --metric-percentiles default.
DEFAULT_BLOCK_PERCENTILES = (99.0,)


def parse_goodput(text: str) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=20` or vllm bench's `ttft:500 tpot:20` (either separator, either name): a
    request counts toward goodput when it meets every limit given, in ms."""
    slo: dict[str, float] = {}
    for part in re.split(r"[,\s]+", text.strip()):
        match = _SLO.match(part)
        key = _VLLM_GOODPUT.get(match.group(1), match.group(1)) if match else ""
        try:
            limit = float(match.group(2)) if match else -1.0
        except ValueError:
            limit = -1.0
        if key not in GOODPUT_KEYS or not 0 < limit < math.inf:
            raise ScenarioError(
                f"--goodput {text!r}: cannot read {part!r}; write KEY:MS (vllm bench's ttft, tpot, e2el) "
                f"or KEY=MS ({', '.join(GOODPUT_KEYS)}), MS above 0, several joined by commas or spaces"
            )
        slo[key] = limit
    return slo


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """`--metric-percentiles 90,95,99.9`: each in [0, 100], as np.percentile takes them."""
    out: list[float] = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not 0 <= value <= 100:
            raise ScenarioError(
                f"--metric-percentiles {text!r}: {part.strip()!r} is not a percentile; give numbers in "
                "[0, 100] joined by commas, e.g. 50,90,99"
            )
        if value not in out:
            out.append(value)
    return tuple(out)


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """`--percentile-metrics ttft,tpot,itl,e2el`: the block's metric sections, in the block's order."""
    names = {part.strip() for part in text.split(",")}
    unknown = sorted(names - set(BLOCK_METRICS))
    if unknown or not names:
        raise ScenarioError(
            f"--percentile-metrics {text!r}: {', '.join(unknown) or 'nothing'} is not a streamed "
            f"completion's metric; give some of {','.join(BLOCK_METRICS)}"
        )
    return tuple(m for m in BLOCK_METRICS if m in names)


def percentile_key(percentile: float) -> str:
    """A percentile's key as vllm bench writes it: p99, p99.9 (summary.json and the result file)."""
    return f"p{int(percentile)}" if int(percentile) == percentile else f"p{percentile}"


@dataclass(frozen=True)
class BlockSettings:
    """A run's choice of the above, as meta.json records it: what its summary computes beside the
    fixed figures (request goodput, extra percentiles) and what its block and result file give."""

    goodput: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = DEFAULT_BLOCK_PERCENTILES
    metrics: tuple[str, ...] = BLOCK_METRICS

    @classmethod
    def from_meta(cls, meta: Meta) -> BlockSettings:
        """meta.json's keys (checked as types when it was read), read as their flags are; a folder
        from before them gets the defaults."""
        goodput = meta.goodput
        percentiles = meta.metric_percentiles or DEFAULT_BLOCK_PERCENTILES
        metrics = meta.percentile_metrics or BLOCK_METRICS
        return cls(
            goodput=parse_goodput(",".join(f"{k}={v}" for k, v in goodput.items())) if goodput else {},
            percentiles=parse_metric_percentiles(",".join(str(p) for p in percentiles)),
            metrics=parse_percentile_metrics(",".join(str(m) for m in metrics)),
        )
