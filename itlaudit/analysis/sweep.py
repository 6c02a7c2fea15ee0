"""Pure figures of a load sweep: per point, per variant; the crossover where speculative decoding
stops paying off per token; the SLA search; goodput from token-true TPOT beside chunk-based TPOT.

Everything here is a function of run folders' summaries and records (read by `sweep.py`), so
`sweep.json` can always be rebuilt from the point folders.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, get_args

import msgspec

from itlaudit.analysis.benchmark import meets_slo
from itlaudit.analysis.metrics import median, speedup
from itlaudit.analysis.summary import VariantSummary
from itlaudit.analysis.validity import block_counts, block_validity
from itlaudit.errors import SweepError
from itlaudit.model.formats import FORMAT_KEY
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.serve_params import ServeValue, setting_label
from itlaudit.model.vocabulary import LoadAxis, QualityGate
from itlaudit.model.workload import BOUNDS as WORKLOAD_BOUNDS

PERCENTILES = ("p50", "p90", "p99")
# The latency figures a point reports and an SLA may name, each as {p50, p90, p99}.
LatencyFigure = Literal["itl_ms", "chunk_itl_ms", "ttft_ms", "tpot_ms", "e2e_ms"]
LATENCY_FIGURES: tuple[LatencyFigure, ...] = ("itl_ms", "chunk_itl_ms", "ttft_ms", "tpot_ms", "e2e_ms")
# One latency figure of a trial or a point: its p50, p90 and p99 (None where no request had it).
Percentiles = dict[str, float | None]
# A point's figures that are one number each (the median over its trials).
Scalar = Literal[
    "output_tokens_per_s",
    "requests_per_s",
    "acceptance_length",
    "goodput_rps",
    "goodput_chunk_rps",
    "duration_s",
]


class RequestFigures(TypedDict):
    """What goodput reads of one request: its status and figures (derived.jsonl's, the record's e2e)."""

    status: str
    e2e_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    chunk_itl_ms: float | None


class TrialFigures(TypedDict):
    """One trial of one point (trial_figures), before its point pools the trials (pool_trials)."""

    requests: int
    errors: int
    duration_s: float | None
    output_tokens_per_s: float | None
    requests_per_s: float | None
    acceptance_length: float | None
    findings: int
    goodput_rps: float | None
    goodput_chunk_rps: float | None
    not_comparable: NotRequired[str | None]
    itl_ms: Percentiles
    chunk_itl_ms: Percentiles
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles


class ConvergenceInterval(TypedDict, total=False):
    """analysis.convergence.Interval's JSON."""

    mean: float
    low: float
    high: float
    confidence: float
    trials: int
    width_pct: float | None


class PointConvergence(TypedDict, total=False):
    """--trials auto: why a point's trials stopped, as its convergence file holds it (format stamped)."""

    format: int
    metric: str
    converged: bool
    reason: str
    interval: ConvergenceInterval | None


class SweepPoint(TypedDict, total=False):
    """One point of sweep.json: a load (keyed by the axis, `concurrency` or `rate`: the one the sweep
    varies) and its figures over its trials (pool_trials). A dict, typed key by key, because it is the
    file's form: msgspec checks it when sweep.json is read, and the keys a point lacks (`spread` with
    one trial, `not_comparable` when comparable, `convergence` without --trials auto; any key in a
    point an older itlaudit wrote) stay absent when it is written back."""

    concurrency: int
    rate: float
    trials: int
    requests: int
    errors: int
    findings: int
    not_comparable: str
    output_tokens_per_s: float | None
    requests_per_s: float | None
    acceptance_length: float | None
    goodput_rps: float | None
    goodput_chunk_rps: float | None
    duration_s: float | None
    itl_ms: Percentiles
    chunk_itl_ms: Percentiles
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    spread: dict[str, list[float]]
    convergence: PointConvergence


def load_of(point: SweepPoint, axis: LoadAxis) -> float:
    """A point's load on the sweep's axis, as written (an int for concurrency)."""
    return point["concurrency"] if axis == LoadAxis.CONCURRENCY else point["rate"]


def latency_of(point: SweepPoint, figure: LatencyFigure) -> Percentiles:
    """A point's {p50, p90, p99} of one latency figure ({} where the point lacks it)."""
    return point.get(figure) or {}


def parse_points(text: str, axis: LoadAxis) -> list[float]:
    """`1,2,4,8`: distinct, positive, ascending after sorting; integers for concurrency."""
    values: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part) if axis == LoadAxis.CONCURRENCY else float(part)
        except ValueError:
            kind = "integers" if axis == LoadAxis.CONCURRENCY else "numbers (requests/s)"
            raise SweepError(
                f"--{axis} {text!r}: {part!r} is not a number; give {kind} like 1,2,4,8"
            ) from None
        # A point is the scenario's concurrency or request_rate: the same bound as that key.
        problem = WORKLOAD_BOUNDS["concurrency" if axis == LoadAxis.CONCURRENCY else "request_rate"].problem(
            value
        )
        if problem is not None:
            raise SweepError(f"--{axis} {text!r}: {part} {problem}")
        values.append(value)
    if len(set(values)) != len(values):
        raise SweepError(f"--{axis} {text!r}: a point is given twice; list each once")
    return sorted(values)


@dataclass(frozen=True)
class SlaTerm:
    """One bound, e.g. tpot_p99_ms <= 20: `figure` (tpot_ms) at `percentile` (p99)."""

    figure: LatencyFigure
    percentile: str
    limit: float
    strict: bool  # `<` rather than `<=`

    @property
    def name(self) -> str:
        return f"{self.figure[:-3]}_{self.percentile}_ms"

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value < self.limit if self.strict else value <= self.limit

    def __str__(self) -> str:
        return f"{self.name}{'<' if self.strict else '<='}{self.limit:g}"


_SLA_TERM = re.compile(r"^\s*([a-z_]+)_(p50|p90|p99)_ms\s*(<=|<)\s*([0-9.]+)\s*$")


def parse_sla(text: str) -> list[SlaTerm]:
    """`tpot_p99_ms<=20,ttft_p99_ms<=500`: every term must hold at a point for it to meet the SLA."""
    terms = []
    known = ", ".join(f"{f[:-3]}_p99_ms" for f in LATENCY_FIGURES)
    for part in text.split(","):
        match = _SLA_TERM.match(part)
        named = f"{match.group(1)}_ms" if match else ""
        figure = next((f for f in LATENCY_FIGURES if f == named), None)
        if match is None or figure is None:
            raise SweepError(
                f"--sla {text!r}: cannot read {part.strip()!r}; write FIGURE_PCT_ms<=LIMIT terms joined by "
                f"commas, FIGURE one of {known} (or p50/p90)"
            )
        try:
            limit = float(match.group(4))
        except ValueError:
            raise SweepError(f"--sla {text!r}: {match.group(4)!r} is not a number") from None
        terms.append(SlaTerm(figure, match.group(2), limit, match.group(3) == "<"))
    return terms


def span_s(records: Sequence[RequestRecord]) -> float | None:
    """First send to last end of a point, on the capture workers' monotonic clock (CLOCK_MONOTONIC is
    one clock for every process on the host): what throughput divides by."""
    ends = [
        (r.sent_monotonic_ns, r.sent_monotonic_ns + r.e2e_ms * 1e6)
        for r in records
        if r.sent_monotonic_ns is not None and r.e2e_ms is not None
    ]
    if not ends:
        return None
    span = (max(end for _, end in ends) - min(start for start, _ in ends)) / 1e9
    return span if span > 0 else None


def goodput(
    requests: Sequence[RequestFigures],
    slo: Mapping[str, float],
    span: float | None,
    tpot_key: Literal["tpot_ms", "chunk_itl_ms"],
) -> float | None:
    """Requests/s that completed and met every SLO, with `tpot_key` standing for TPOT: `tpot_ms`
    (token-true) or `chunk_itl_ms` (what a chunk-counting tool would take for it)."""
    if not slo or span is None:
        return None

    def meets(request: RequestFigures) -> bool:
        named: dict[str, float | None] = {
            "e2e_ms": request["e2e_ms"],
            "ttft_ms": request["ttft_ms"],
            "tpot_ms": request[tpot_key],
            "chunk_itl_ms": request["chunk_itl_ms"],
        }
        figures = {key: named.get(key) for key in slo}
        return request["status"] == Status.OK and meets_slo(figures, slo)

    return sum(1 for r in requests if meets(r)) / span


def _figure(line: JSONMapping, key: str) -> float | None:
    value = line.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_figures(record: RequestRecord, derived: JSONMapping) -> RequestFigures:
    """The per-request figures goodput reads: derived.jsonl's line (JSON as read: a figure that is not
    a number is None) plus the raw status and e2e."""
    return {
        "status": record.status,
        "e2e_ms": record.e2e_ms,
        "ttft_ms": _figure(derived, "ttft_ms"),
        "tpot_ms": _figure(derived, "tpot_ms"),
        "chunk_itl_ms": _figure(derived, "chunk_itl_ms"),
    }


def trial_figures(
    block: VariantSummary,
    records: Sequence[RequestRecord],
    requests: Sequence[RequestFigures],
    slo: Mapping[str, float],
    *,
    base: VariantSummary | None = None,
    gate: QualityGate = QualityGate.RELATIVE,
) -> TrialFigures:
    """One trial of one point: a summary's variant block plus what needs the records (span,
    throughput, goodput). `base` is the baseline variant's block at the same load (None for the
    baseline itself), against which the quality gate judges this one."""
    span = span_s(records)
    ok = [r for r in records if r.status == Status.OK]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    acceptance = block.decode_tokens_per_chunk.get("mean")

    def latency(name: LatencyFigure) -> Percentiles:
        stats = block.distributions.get(name) or {}
        return {p: stats.get(p) for p in PERCENTILES}

    return {
        "requests": block.requests,
        "errors": block.errors,
        "duration_s": span,
        "output_tokens_per_s": tokens / span if span else None,
        "requests_per_s": len(ok) / span if span else None,
        "acceptance_length": acceptance,
        "findings": sum(block.findings.values()),
        "goodput_rps": goodput(requests, slo, span, "tpot_ms"),
        "goodput_chunk_rps": goodput(requests, slo, span, "chunk_itl_ms"),
        # analysis.validity's rule: a point cut short, failing or gibberish is never ranked.
        "not_comparable": block_validity(
            block_counts(block), base=block_counts(base) if base is not None else None, gate=gate
        ).reason,
        "itl_ms": latency("itl_ms"),
        "chunk_itl_ms": latency("chunk_itl_ms"),
        "ttft_ms": latency("ttft_ms"),
        "tpot_ms": latency("tpot_ms"),
        "e2e_ms": latency("e2e_ms"),
    }


def _spread(values: Sequence[float | None]) -> list[float] | None:
    kept = [v for v in values if v is not None]
    return [min(kept), max(kept)] if len(kept) > 1 else None


SCALARS: tuple[Scalar, ...] = get_args(Scalar)  # the Literal's names, in its order


def pool_trials(axis: LoadAxis, value: float, trials: Sequence[TrialFigures]) -> SweepPoint:
    """A point over its trials: the median of each figure, its [min, max] under `spread` when there
    were several trials (the plots' error bars), requests and findings summed, and `not_comparable`
    when any trial broke analysis.validity's rule."""
    point: SweepPoint = {"concurrency": int(value)} if axis == LoadAxis.CONCURRENCY else {"rate": value}
    point["trials"] = len(trials)
    point["requests"] = sum(t["requests"] for t in trials)
    point["errors"] = sum(t["errors"] for t in trials)
    point["findings"] = sum(t["findings"] for t in trials)
    # Only where it applies, so a sweep.json of comparable points reads as before.
    if reasons := "; ".join(dict.fromkeys(r for t in trials if (r := t.get("not_comparable")))):
        point["not_comparable"] = reasons
    spread: dict[str, list[float]] = {}
    for key in SCALARS:
        point[key] = median([t[key] for t in trials])
        if (band := _spread([t[key] for t in trials])) is not None:
            spread[key] = band
    for name in LATENCY_FIGURES:
        pooled: Percentiles = {}
        for pct in PERCENTILES:
            values = [t[name][pct] for t in trials]
            pooled[pct] = median(values)
            if (band := _spread(values)) is not None:
                spread[f"{name}.{pct}"] = band
        point[name] = pooled
    if spread:
        point["spread"] = spread
    return point


def sla_figure(point: SweepPoint, term: SlaTerm) -> float | None:
    return latency_of(point, term.figure).get(term.percentile)


def meets_sla(point: SweepPoint, sla: Sequence[SlaTerm]) -> bool:
    return all(term.met(sla_figure(point, term)) for term in sla)


@dataclass(frozen=True)
class SlaSearch:
    """Where the search stands: `probe` is the next load to measure (None when done); `limit` the
    highest load measured to meet the SLA (None if none did); `above_range` when even the highest
    grid point met it; `failed_at` the lowest load measured to miss it above `limit`."""

    probe: float | None
    limit: float | None
    failed_at: float | None
    above_range: bool


def sla_search(
    points: Mapping[float, SweepPoint],
    grid: Sequence[float],
    sla: Sequence[SlaTerm],
    precision: float,
) -> SlaSearch:
    """Bisection between the last grid point that meets the SLA (with every lower one meeting it too)
    and the first that does not, until the two are `precision` apart (1 for concurrency: an integer
    answer). Pure over the points measured so far, so a resumed sweep picks up where it stopped."""
    lo: float | None = None
    hi: float | None = None
    for value in sorted(grid):
        if value not in points:
            return SlaSearch(probe=value, limit=None, failed_at=None, above_range=False)
        if meets_sla(points[value], sla):
            lo = value
        else:
            hi = value
            break
    if hi is None:
        return SlaSearch(probe=None, limit=lo, failed_at=None, above_range=True)
    if lo is None:
        return SlaSearch(probe=None, limit=None, failed_at=hi, above_range=False)
    while hi - lo > precision:
        mid = (lo + hi) / 2
        if precision >= 1:
            mid = float(math.floor(mid))
        if mid <= lo or mid >= hi:
            break
        if mid not in points:
            return SlaSearch(probe=mid, limit=lo, failed_at=hi, above_range=False)
        if meets_sla(points[mid], sla):
            lo = mid
        else:
            hi = mid
    return SlaSearch(probe=None, limit=lo, failed_at=hi, above_range=False)


def per_token_speedup(base: SweepPoint, other: SweepPoint) -> float | None:
    """How many times faster `other` is per token than `base` (token ITL p50; >1: other is faster)."""
    return speedup(
        latency_of(base, "itl_ms").get("p50"), latency_of(other, "itl_ms").get("p50"), lower_is_better=True
    )


def _load_words(axis: LoadAxis, value: float) -> str:
    return f"concurrency {int(value)}" if axis == LoadAxis.CONCURRENCY else f"{value:g} requests/s"


def _at(axis: LoadAxis, value: float) -> str:
    return f"{int(value)}" if axis == LoadAxis.CONCURRENCY else f"{value:g} requests/s"


@dataclass(frozen=True)
class Crossover:
    """`last_faster`: the highest load up to which `variant` was faster per token at every point;
    `first_slower`: the next load, where `base` was faster (None: no crossover in range)."""

    variant: str
    base: str
    last_faster: float | None
    first_slower: float | None
    factor_there: float | None  # base over variant at first_slower (or variant over base if no cross)
    headline: str


def crossover(
    axis: LoadAxis, base: str, variant: str, series: Mapping[str, Sequence[SweepPoint]]
) -> Crossover:
    """The load at which `variant` stops being faster per token than `base`, over the loads both
    measured where both are comparable (analysis.validity: a point cut short or failing is left out,
    and the sentence the report leads with says so)."""
    by_load = {load_of(p, axis): p for p in series[base]}
    shared = [(load, p) for p in series[variant] if (load := load_of(p, axis)) in by_load]
    unlike = {load: why for load, p in shared if (why := _unlike(base, by_load[load], variant, p))}
    measured = [(load, per_token_speedup(by_load[load], p)) for load, p in shared if load not in unlike]
    pairs = sorted((load, s) for load, s in measured if s is not None)
    left_out = "".join(
        f" Not comparable at {_load_words(axis, load)} ({why}): left out."
        for load, why in sorted(unlike.items())
    )
    if not pairs:
        words = f"{variant} vs {base}: no load measured by both" + (" is comparable." if unlike else ".")
        return Crossover(variant, base, None, None, None, words + left_out)
    crossed = _crossover(axis, base, variant, pairs)
    return dataclasses.replace(crossed, headline=crossed.headline + left_out)


def _unlike(base: str, base_point: SweepPoint, variant: str, point: SweepPoint) -> str:
    """Why a load's two points may not be compared ("" when they may): each side's reason, named."""
    reasons = ((base, base_point.get("not_comparable")), (variant, point.get("not_comparable")))
    return "; ".join(f"{name}: {why}" for name, why in reasons if why)


def _crossover(axis: LoadAxis, base: str, variant: str, pairs: Sequence[tuple[float, float]]) -> Crossover:
    """crossover over (load, per-token speedup) pairs of comparable points, sorted by load."""
    span = f"{_at(axis, pairs[0][0])}–{_at(axis, pairs[-1][0])}" if len(pairs) > 1 else _at(axis, pairs[0][0])
    if pairs[0][1] <= 1:
        slowest = min(pairs, key=lambda p: p[1])
        words = (
            f"{variant} is not faster per token than {base} at any {axis} in range ({span}); "
            f"at {_load_words(axis, slowest[0])}, {base} is {1 / slowest[1]:.2f}× faster: "
            "no crossover in range."
        )
        return Crossover(variant, base, None, pairs[0][0], 1 / pairs[0][1], words)
    last_faster = pairs[0]
    for load, factor in pairs:
        if factor <= 1:
            words = (
                f"{variant} is faster per token up to {_load_words(axis, last_faster[0])} "
                f"({last_faster[1]:.2f}×); at {_at(axis, load)}, {base} is {1 / factor:.2f}× faster."
            )
            return Crossover(variant, base, last_faster[0], load, 1 / factor, words)
        last_faster = (load, factor)
    words = (
        f"{variant} is faster per token than {base} at every {axis} in range ({span}; "
        f"{last_faster[1]:.2f}× at {_at(axis, last_faster[0])}): no crossover in range."
    )
    return Crossover(variant, base, last_faster[0], None, last_faster[1], words)


def sla_words(
    axis: LoadAxis, variant: str, search: SlaSearch, sla: Sequence[SlaTerm], point: SweepPoint | None
) -> str:
    terms = ", ".join(str(t) for t in sla)
    if search.limit is None:
        where = _load_words(axis, search.failed_at) if search.failed_at is not None else "any load"
        return f"{variant}: the SLA ({terms}) is not met even at {where}."
    measured = ", ".join(f"{t.name} {sla_figure(point, t):.1f}" for t in sla) if point else ""
    bound = " (the highest point in range: the limit is above it)" if search.above_range else ""
    highest = _load_words(axis, search.limit)
    return f"{variant}: highest {highest} meeting {terms}{bound}; measured there: {measured}."


class SlaVariant(msgspec.Struct, kw_only=True):
    """One variant's SLA search as sweep.json keeps it: SlaSearch's fields, the point at the limit
    found, and the sentence."""

    probe: float | None
    limit: float | None
    failed_at: float | None
    above_range: bool
    point: SweepPoint | None
    words: str


class SlaVerdicts(msgspec.Struct, kw_only=True):
    """sweep.json's `sla`: the terms as given, the search precision, each measured variant's result."""

    terms: str
    precision: float
    variants: dict[str, SlaVariant]


class BestSetting(msgspec.Struct, kw_only=True):
    """A swept variant's best server setting at one load (`--serve-param`): the setting whose points
    give the lowest token ITL p50, and the highest goodput where an SLO was given, among the points
    that are comparable (analysis.validity: a setting whose outputs were cut short, failed or broke is
    never the answer); the ones left out with why."""

    variant: str
    load: float
    by_itl: str | None
    itl_ms: float | None
    by_goodput: str | None = None
    goodput_rps: float | None = None
    left_out: dict[str, str] = msgspec.field(default_factory=dict)
    words: str


def _itl(point: SweepPoint) -> float | None:
    value = latency_of(point, "itl_ms").get("p50")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def best_settings(
    axis: LoadAxis,
    series: Mapping[str, Sequence[SweepPoint]],
    settings: Mapping[str, Mapping[str, ServeValue]],
) -> list[BestSetting]:
    """Per swept variant and load, the best setting by token ITL (and goodput): "which K?" answered
    per load, since the K that pays at concurrency 1 may not at 16."""
    groups: dict[str, list[str]] = {}
    for name, setting in settings.items():
        groups.setdefault(str(setting["variant"]), []).append(name)
    found = []
    for base, names in groups.items():
        by_load: dict[float, dict[str, SweepPoint]] = {}
        for name in names:
            for point in series.get(name, []):
                by_load.setdefault(float(load_of(point, axis)), {})[name] = point
        for load, points in sorted(by_load.items()):
            found.append(_best_at(axis, base, load, points, settings))
    return found


def _best_at(
    axis: LoadAxis,
    base: str,
    load: float,
    points: Mapping[str, SweepPoint],
    settings: Mapping[str, Mapping[str, ServeValue]],
) -> BestSetting:
    def label(name: str) -> str:
        return setting_label({k: v for k, v in settings[name].items() if k != "variant"})

    left_out = {name: why for name, p in points.items() if (why := p.get("not_comparable"))}
    itl = {name: v for name, p in points.items() if name not in left_out and (v := _itl(p)) is not None}
    good = {
        name: float(v)
        for name, p in points.items()
        if name not in left_out and isinstance(v := p.get("goodput_rps"), int | float)
    }
    by_itl = min(itl, key=lambda n: itl[n]) if itl else None
    by_goodput = max(good, key=lambda n: good[n]) if good else None
    where = _load_words(axis, load)
    if by_itl is None:
        words = f"{base} at {where}: no setting measured a comparable token ITL"
    else:
        others = ", ".join(f"{label(n)} {v:.2f}" for n, v in itl.items() if n != by_itl)
        words = f"{base} at {where}: {label(by_itl)} has the lowest token ITL, {itl[by_itl]:.2f} ms"
        words += f" ({others})" if others else ""
        if by_goodput is not None:
            words += f"; the highest goodput is {label(by_goodput)}'s, {good[by_goodput]:.2f} requests/s"
    if left_out:
        words += "; not comparable: " + "; ".join(f"{label(n)} ({why})" for n, why in left_out.items())
    return BestSetting(
        variant=base,
        load=load,
        by_itl=by_itl,
        itl_ms=itl.get(by_itl) if by_itl else None,
        by_goodput=by_goodput,
        goodput_rps=good.get(by_goodput) if by_goodput else None,
        left_out=left_out,
        words=words + ".",
    )


class SweepResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """sweep.json: per variant its points (trial_figures pooled over trials, in grid order), the
    crossovers against the first measured variant, the SLA searches when --sla was given, and the
    headline sentences. Encodes to the same keys the dict it replaced held (`sla` absent without
    --sla); `format` is stamped by the writer, and `from_json` reads the previous format too."""

    scenario: str
    axis: LoadAxis
    grid: list[float]
    trials: int
    goodput_slo: dict[str, float] | None
    variants: dict[str, list[SweepPoint]]
    crossovers: list[Crossover]
    headline: list[str]
    sla: SlaVerdicts | None = None
    # --serve-param: each swept variant's setting ({"variant": the scenario's variant, NAME: value})
    # and the best setting per load; absent for a sweep of fixed servers.
    settings: dict[str, dict[str, ServeValue]] | None = None
    best: list[BestSetting] | None = None

    def to_json(self) -> JSONObject:
        """sweep.json's content (without `format`, which the writer stamps)."""
        data: JSONObject = msgspec.to_builtins(self)
        return data

    @classmethod
    def from_json(cls, data: JSONMapping) -> SweepResult:
        """A sweep.json's content (format 1, unversioned, or the current one: the keys are the same)."""
        try:
            return msgspec.convert({k: v for k, v in data.items() if k != FORMAT_KEY}, cls)
        except msgspec.ValidationError as exc:
            raise SweepError(
                f"sweep.json does not read as a sweep ({exc}): `itlaudit sweep --resume --out DIR` "
                "rebuilds it"
            ) from None


def sweep_result(
    scenario: str,
    axis: LoadAxis,
    grid: list[float],
    trials: int,
    series: dict[str, list[SweepPoint]],
    *,
    goodput: Mapping[str, float] | None = None,
    sla: str | None = None,
    sla_precision: float = 1.0,
    settings: Mapping[str, Mapping[str, ServeValue]] | None = None,
) -> SweepResult:
    """sweep.json's content from each variant's points: crossovers of every measured variant against
    the first, then the SLA search per variant when `sla` is given."""
    measured = [name for name, points in series.items() if points]
    crossovers = [crossover(axis, measured[0], other, series) for other in measured[1:]]
    headline = [found.headline for found in crossovers]
    verdicts = None
    if sla:
        terms = parse_sla(sla)
        verdicts = SlaVerdicts(terms=sla, precision=sla_precision, variants={})
        for name in measured:
            points = {load_of(p, axis): p for p in series[name]}
            search = sla_search(points, grid, terms, sla_precision)
            at = points.get(search.limit) if search.limit is not None else None
            words = sla_words(axis, name, search, terms, at)
            verdicts.variants[name] = SlaVariant(**dataclasses.asdict(search), point=at, words=words)
            headline.append(words)
    best = best_settings(axis, series, settings) if settings else None
    headline = [found.words for found in best or []] + headline  # "which K?" is the question asked
    return SweepResult(
        scenario=scenario,
        axis=axis,
        grid=grid,
        trials=trials,
        goodput_slo=dict(goodput) if goodput else None,
        variants=series,
        crossovers=crossovers,
        headline=headline,
        sla=verdicts,
        settings={name: dict(setting) for name, setting in settings.items()} if settings else None,
        best=best,
    )
