"""Series and change points over a history of builds: pure functions, no storage.

A point is one variant measured on one build (K0 of last night's nightly); its series is every point
with the same fingerprint but the build (platform, model, variant name, workload, client settings);
its family is the series without the variant's name, so that K0 and K3 of one experiment sit side by
side and their K3/K0 token-ITL speedup is a series of its own (a lost MTP speedup is a regression even
when K0 got faster).

Validity comes first (analysis/validity.py's rule): a point whose outputs were cut short, whose
requests failed or whose text is gibberish, or whose client was saturated, is never a speed point. Its
change is the change of validity itself ("output length changed: capped at 128 tokens from build X"),
and the speed series run over the valid points only, so a cap is never read as a speedup.

On each speed series, the search for change points is ruptures' KernelCPD (linear kernel: the
least-squares segmentation, PELT in C) on the log of the per-build values in units of the series' own
noise, run over overlapping windows of builds so that 10,000 builds cost what 40 short series cost.
A candidate is kept only when the raw per-request samples of the builds either side (up to
`window` valid builds, not crossing another candidate) differ by Mann–Whitney U (analysis/stats.py's
compare_samples, the test `diff` uses) and by at least the minimum effect; every other candidate is
noise. Candidates from every series of a family at one build are one change, classified by what moved.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple, TypedDict, overload

import numpy as np

from itlaudit.analysis.stats import compare_samples
from itlaudit.model.vocabulary import Shift

# The per-request raw figures a point keeps (RequestMetrics' names): token ITL, TPOT, TTFT, decode
# throughput, output length, and acceptance as the stream shows it (decode tokens per chunk).
SAMPLE_FIELDS = (
    "itl_ms",
    "tpot_ms",
    "ttft_ms",
    "decode_tokens_per_s",
    "completion_tokens",
    "decode_tokens_per_chunk",
)
Samples = Mapping[str, Sequence[float | None]]

# Validity kinds (a point's `validity`; "" is a valid point) and the change class each one gives.
VALID = ""
LENGTH, CORRECTNESS, CLIENT = "length", "correctness", "client"
# Change classes.
LENGTH_CAP, SPEED, SPEEDUP_CLASS, METHOD = "length/cap", "speed", "speedup", "method"
LENGTH_CHANGED = "length"
SERVER = "server"  # a signal of the server or its GPU moved (issue 27): KV usage, acceptance, clocks
_VALIDITY_CLASS = {LENGTH: LENGTH_CAP, CORRECTNESS: CORRECTNESS, CLIENT: CLIENT}
# A family holding several classes at one build is named by the most telling one: a cap or broken
# output explains every figure beside it, a changed method explains a speed, a lost speedup is more
# specific than the slower ITL it is made of.
# A server signal that moved with a speed is the speed change's evidence (why it moved); alone, it is
# a change of its own.
_CLASS_ORDER = (LENGTH_CAP, CORRECTNESS, CLIENT, METHOD, SPEEDUP_CLASS, SPEED, LENGTH_CHANGED, SERVER)
REGRESSION, IMPROVEMENT, FIX = "regression", "improvement", "fix"
SUSPECTED, CONFIRMED, EXPLAINED = "suspected", "confirmed", "explained"
BASE_VARIANT = "K0"


@dataclass(frozen=True)
class SeriesSpec:
    """One tracked series: the statistic of a raw figure over a point's requests."""

    name: str
    sample: str
    quantile: float
    lower_is_better: bool
    label: str
    change_class: str = SPEED


# The stream's series: a statistic of each request's figure (the point's samples).
STREAM_SERIES = (
    SeriesSpec("itl_p50", "itl_ms", 0.5, True, "token ITL p50"),
    SeriesSpec("itl_p90", "itl_ms", 0.9, True, "token ITL p90"),
    SeriesSpec("tpot", "tpot_ms", 0.5, True, "TPOT p50"),
    SeriesSpec("ttft", "ttft_ms", 0.5, True, "TTFT p50"),
    SeriesSpec("throughput", "decode_tokens_per_s", 0.5, False, "decode tokens/s p50"),
    SeriesSpec("output_len", "completion_tokens", 0.5, False, "output length p50", LENGTH_CHANGED),
    SeriesSpec("acceptance", "decode_tokens_per_chunk", 0.5, False, "acceptance (tokens/chunk) p50"),
)
# What the server and its GPU said during the measured window (issue 27; the figures of summary.json's
# `server` block, analysis/server_metrics.py), from their raw samples as the stream's series are: each
# /metrics scrape's KV-cache usage, each request's acceptance length as the server counted it (its
# per-request spec-decode metrics), each NVML reading's SM clock and power. A point whose run sampled
# none of them (an old folder, --no-server-metrics, no GPU) has no value there: absent, never zero.
SERVER_SAMPLES = (
    "server.kv_usage",
    "server.acceptance_length",
    "server.gpu_sm_clock_mhz",
    "server.gpu_power_w",
    "server.gpu_joules_per_token",
)
SERVER_SERIES = (
    SeriesSpec("kv_usage_p50", "server.kv_usage", 0.5, True, "KV-cache usage p50", SERVER),
    SeriesSpec("kv_usage_max", "server.kv_usage", 1.0, True, "KV-cache usage max", SERVER),
    SeriesSpec(
        "server_acceptance", "server.acceptance_length", 0.5, False, "acceptance length (server) p50", SERVER
    ),
    SeriesSpec("gpu_sm_clock", "server.gpu_sm_clock_mhz", 0.5, False, "GPU SM clock p50", SERVER),
    SeriesSpec("gpu_power_max", "server.gpu_power_w", 1.0, True, "GPU power max", SERVER),
    # one sample a point: the window's joules per output token (NVML's counter, or power integrated)
    SeriesSpec(
        "gpu_joules_per_token", "server.gpu_joules_per_token", 0.5, True, "GPU J per output token", SERVER
    ),
)
SERIES = (*STREAM_SERIES, *SERVER_SERIES)
# A series derived across a family: base token ITL p50 / variant token ITL p50.
SPEEDUP = SeriesSpec("speedup", "itl_ms", 0.5, False, "token-ITL speedup over K0", SPEEDUP_CLASS)


def _quantile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) quantile of a short list, without numpy's per-call cost: a point is
    recorded once per series and a history holds 200,000 of them."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def point_values(samples: Samples) -> dict[str, float | None]:
    """Each series' value for one point, from its raw samples (None where no request defines it)."""
    values: dict[str, float | None] = {}
    for spec in SERIES:
        finite = [float(v) for v in samples.get(spec.sample, ()) if v is not None and math.isfinite(v)]
        values[spec.name] = _quantile(finite, spec.quantile) if finite else None
    return values


@dataclass(frozen=True)
class Point:
    """One variant on one build, as the series need it; its raw samples are fetched on demand."""

    id: int
    family: str
    variant: str
    order: int  # the build's position in first-parent order; gaps are missing nightlies
    build: str  # what a person calls the build: version and commit
    method: str  # digest of server args, environment and build flavour: a change here is a method change
    validity: str  # VALID, LENGTH, CORRECTNESS or CLIENT
    reason: str | None
    cap: int | None
    values: Mapping[str, float | None]


@dataclass(frozen=True)
class CheckSettings:
    """min_effect: the smallest relative move worth an alarm (0.1 = 10 %); alpha: Mann–Whitney's
    level; window: valid builds either side whose samples are pooled for the test; penalty: ruptures'
    penalty per change point, times log(builds), in units of the series' noise."""

    min_effect: float = 0.10
    alpha: float = 0.01
    window: int = 5
    penalty: float = 4.0
    base_variant: str = BASE_VARIANT
    # A family none of whose latest `blind_builds` builds holds a valid point cannot be told about.
    blind_builds: int = 10


@dataclass(frozen=True)
class Evidence:
    """One series that moved at a change: the medians either side of it and the test."""

    variant: str
    series: str
    before: float | None
    after: float | None
    ratio: float | None
    p_value: float | None
    verdict: str

    def to_json(self) -> EvidenceJSON:
        return EvidenceJSON(
            variant=self.variant,
            series=self.series,
            before=self.before,
            after=self.after,
            ratio=self.ratio,
            p_value=self.p_value,
            verdict=self.verdict,
        )


class EvidenceJSON(TypedDict):
    """Evidence as `check --json`, the check cache and the dashboard write it."""

    variant: str
    series: str
    before: float | None
    after: float | None
    ratio: float | None
    p_value: float | None
    verdict: str


# A change's signals: each moved series' ratio (`K3.itl_p50`), `method_changed`, and what people and
# bisections said of it (`explained`, `culprit`).
Signals = dict[str, float | bool | str | None]


ChangeJSON = TypedDict(
    "ChangeJSON",
    {
        "id": str,
        "family": str,
        "order": int,
        "build": str,
        "last_good_order": int | None,
        "last_good_build": str | None,
        "class": str,
        "kind": str,
        "state": str,
        "summary": str,
        "closed_by": str | None,
        "evidence": list[EvidenceJSON],
        "signals": Signals,
    },
)


@dataclass
class Change:
    """A change point of one family: the first build that shows it, the last one before it, what moved
    and why it is classed as it is. `kind`: regression, improvement or fix (validity restored)."""

    family: str
    order: int
    build: str
    last_good_order: int | None
    last_good_build: str | None
    change_class: str
    kind: str
    summary: str
    state: str = CONFIRMED
    evidence: list[Evidence] = field(default_factory=list)
    signals: Signals = field(default_factory=dict)
    closed_by: str | None = None

    @property
    def id(self) -> str:
        """Stable across checks, so a note (`track explain`) stays on it."""
        text = f"{self.family}@{self.order}:{self.change_class}:{self.kind}"
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def to_json(self) -> ChangeJSON:
        return {
            "id": self.id,
            "family": self.family,
            "order": self.order,
            "build": self.build,
            "last_good_order": self.last_good_order,
            "last_good_build": self.last_good_build,
            "class": self.change_class,
            "kind": self.kind,
            "state": self.state,
            "summary": self.summary,
            "closed_by": self.closed_by,
            "evidence": [e.to_json() for e in self.evidence],
            "signals": self.signals,
        }

    @classmethod
    def from_json(cls, data: ChangeJSON) -> Change:
        """The change as to_json wrote it (the incremental check's cache)."""
        return cls(
            family=data["family"],
            order=int(data["order"]),
            build=data["build"],
            last_good_order=data["last_good_order"],
            last_good_build=data["last_good_build"],
            change_class=data["class"],
            kind=data["kind"],
            summary=data["summary"],
            state=data["state"],
            evidence=[Evidence(**e) for e in data["evidence"]],
            signals=dict(data["signals"]),
            closed_by=data["closed_by"],
        )


@dataclass(frozen=True)
class _Candidate:
    variant: str
    spec: SeriesSpec
    order: int
    last_good: int | None
    kind: str
    evidence: Evidence | None
    suspected: bool = False
    reason: str | None = None
    method_changed: bool = False
    waits_for: str | None = None  # what confirms a suspected candidate


# What confirms a suspected change (docs/track.md): the newest build alone off its series needs one
# more build that is off it the same way (a change holds on two builds after it); a move whose
# samples either side are too few to test needs more of them.
_ONE_MORE_BUILD = "1 more build off the series the same way confirms it"
_MORE_SAMPLES = "too few samples either side to test it: more builds or trials confirm it"


_ORDER = attrgetter("order")
SampleLoader = Callable[[Sequence[int]], Mapping[int, Samples]]


def _pooled(point_ids: Iterable[int], samples: Mapping[int, Samples], sample: str) -> list[float]:
    return [float(v) for pid in point_ids for v in samples[pid].get(sample, ()) if v is not None]


def _breakpoints(logs: np.ndarray, penalty: float, span: int = 128, overlap: int = 32) -> list[int]:
    """Indices where a new segment starts, found by KernelCPD over overlapping windows; a window holds
    `span` builds, so the search costs O(n · span) rather than O(n²) on a long history."""
    import ruptures  # type: ignore[import-untyped]

    n = logs.size
    if n < 4:
        return []
    diffs = np.abs(np.diff(logs))
    # The series' noise from successive differences (a step moves one of them, not the median).
    sigma = max(1.4826 * float(np.median(diffs)) / math.sqrt(2), 1e-3)
    z = ((logs - np.median(logs)) / sigma).reshape(-1, 1)
    found: set[int] = set()
    start = 0
    while True:
        stop = min(n, start + span)
        chunk = z[start:stop]
        if chunk.shape[0] >= 4:
            pen = penalty * math.log(n)
            ends = ruptures.KernelCPD(kernel="linear", min_size=2).fit(chunk).predict(pen=pen)
            found.update(start + int(e) for e in ends[:-1])
        if stop == n:
            break
        start = stop - overlap
    # Two windows may place one step a build apart: keep the first of a close pair.
    merged: list[int] = []
    for index in sorted(found):
        if not merged or index - merged[-1] > 1:
            merged.append(index)
    return merged


def _tail_candidate(logs: np.ndarray, min_effect: float) -> list[int]:
    """The newest build alone off its series by more than the minimum effect: too new for the search
    (a segment needs two builds), worth a suspected change and another trial."""
    if logs.size < 4:
        return []
    before = float(np.median(logs[-6:-1]))
    return [logs.size - 1] if abs(logs[-1] - before) > math.log1p(min_effect) else []


def _holds(logs: np.ndarray, low: int, cut: int, high: int, window: int, step: float) -> bool:
    """A change at `cut` (its segment [low, high)) holds: each of the first two builds after it is off
    the builds before it by half the minimum effect at least, the same way (one slow nightly is noise)."""
    before = float(np.median(logs[max(low, cut - window) : cut]))
    moves = logs[cut : min(high, cut + 2)] - before
    return moves.size >= 2 and bool(np.all(moves > step / 2) or np.all(moves < -step / 2))


def _per_build(points: Sequence[Point]) -> list[tuple[int, list[Point]]]:
    """(order, the build's points) in build order (a history reads sorted, so the sort is one pass)."""
    ordered = sorted(points, key=_ORDER)
    return [(order, list(group)) for order, group in groupby(ordered, key=_ORDER)]


def _series_candidates(
    variant: str,
    spec: SeriesSpec,
    builds: Sequence[tuple[int, Sequence[Point]]],
    values: Sequence[float] | np.ndarray,
    samples_of: Callable[[Sequence[Point]], list[float]],
    settings: CheckSettings,
) -> list[_Candidate]:
    """Change points of one series over its valid builds, each tested on raw samples."""
    logs = np.log(np.asarray(values, dtype=float))
    cuts = sorted(_breakpoints(logs, settings.penalty))
    step = math.log1p(settings.min_effect)
    edges = [0, *cuts, len(builds)]
    holding = {
        c for k, c in enumerate(cuts, 1) if _holds(logs, edges[k - 1], c, edges[k + 1], settings.window, step)
    }
    # The newest build right after a change that holds belongs to that change (a change holds on its
    # two builds after it); split off as a tail of its own, it left the change one build long, dropped.
    tail = [t for t in _tail_candidate(logs, settings.min_effect) if t - 1 not in holding]
    bounds = [0, *sorted({*cuts, *tail}), len(builds)]
    found = []
    for k in range(1, len(bounds) - 1):
        cut = bounds[k]
        left = builds[max(bounds[k - 1], cut - settings.window) : cut]
        right = builds[cut : min(bounds[k + 1], cut + settings.window)]
        if cut not in tail and not _holds(logs, bounds[k - 1], cut, bounds[k + 1], settings.window, step):
            continue
        comparison = compare_samples(
            samples_of([p for _, pts in left for p in pts]),
            samples_of([p for _, pts in right for p in pts]),
            lower_is_better=spec.lower_is_better,
            threshold=1 + settings.min_effect,
            alpha=settings.alpha,
        )
        verdict = comparison.verdict
        if comparison.ratio is None or abs(math.log(comparison.ratio)) < step:
            continue  # below the minimum effect, whatever the test says: in every class and series
        suspected = cut in tail and verdict != Shift.SAME
        if verdict in (Shift.SAME, Shift.UNKNOWN) and not suspected:
            continue
        if verdict == Shift.UNKNOWN:  # a suspected change: its direction is the medians'
            moved = comparison.ratio or 1.0
            got_worse = moved > 1 if spec.lower_is_better else moved < 1
            kind = REGRESSION if got_worse else IMPROVEMENT
        else:
            kind = REGRESSION if verdict == Shift.WORSE else IMPROVEMENT
        if spec.change_class == LENGTH_CHANGED:
            kind = REGRESSION  # an output length moved without a cap: a change either way
        evidence = Evidence(
            variant,
            spec.name,
            comparison.base_median,
            comparison.new_median,
            comparison.ratio,
            comparison.p_value,
            verdict.value,
        )
        methods_before = {p.method for p in left[-1][1]}
        methods_after = {p.method for p in right[0][1]}
        found.append(
            _Candidate(
                variant,
                spec,
                builds[cut][0],
                builds[cut - 1][0],
                kind,
                evidence,
                suspected=suspected or verdict == Shift.UNKNOWN,
                method_changed=methods_before != methods_after,
                waits_for=_MORE_SAMPLES
                if verdict == Shift.UNKNOWN
                else _ONE_MORE_BUILD
                if suspected
                else None,
            )
        )
    return found


def _waits_for(verdict: Shift, suspected: bool) -> str | None:
    if verdict == Shift.UNKNOWN:
        return _MORE_SAMPLES
    return _ONE_MORE_BUILD if suspected else None


def _validity_candidates(variant: str, builds: Sequence[tuple[int, Sequence[Point]]]) -> list[_Candidate]:
    """Every change of validity along a series: valid → invalid is a regression of that kind,
    invalid → valid a fix. A build is invalid when any of its points is."""
    found = []
    previous: tuple[int, str, Sequence[Point]] | None = None
    for order, points in builds:
        bad = next((p for p in points if p.validity != VALID), None)
        state = bad.validity if bad else VALID
        if previous is not None and state != previous[1]:
            before_state = previous[1]
            kind = FIX if state == VALID else REGRESSION
            reason = _validity_line(bad) if bad else _restored_line(before_state)
            cls = _VALIDITY_CLASS[bad.validity if bad else before_state]
            spec = SeriesSpec("validity", "completion_tokens", 0.5, False, "validity", cls)
            evidence = _length_evidence(variant, previous[2], points, reason)
            found.append(_Candidate(variant, spec, order, previous[0], kind, evidence, reason=reason))
        previous = (order, state, points)
    return found


def _length_evidence(variant: str, before: Sequence[Point], after: Sequence[Point], reason: str) -> Evidence:
    """A validity change's evidence: the output-length medians of the builds either side (what a cap
    moves first) and what changed, in the verdict's place."""

    def length(points: Sequence[Point]) -> float | None:
        values = [float(v) for p in points if (v := p.values.get("output_len")) is not None]
        return float(np.median(values)) if values else None

    old, new = length(before), length(after)
    ratio = new / old if old and new is not None else None
    return Evidence(variant, "output_len", old, new, ratio, None, reason)


def _validity_line(point: Point) -> str:
    if point.validity == LENGTH:
        return f"capped at {point.cap} tokens" if point.cap else f"cut short ({point.reason})"
    return point.reason or point.validity


def _restored_line(kind: str) -> str:
    return {LENGTH: "output length restored", CORRECTNESS: "outputs valid again"}.get(
        kind, "client no longer saturated"
    )


@dataclass(frozen=True)
class _BuildTable:
    """A variant's builds as arrays: orders, their points, and each series' per-build value (the median
    over the build's trials; NaN where a point lacks it), so 10,000 builds are scanned by numpy."""

    orders: np.ndarray
    groups: list[list[Point]]
    values: np.ndarray  # (builds, len(SERIES))

    @classmethod
    def of(cls, builds: Sequence[tuple[int, list[Point]]]) -> _BuildTable:
        names = [spec.name for spec in SERIES]
        groups = [pts for _, pts in builds]
        orders = np.fromiter((o for o, _ in builds), dtype=np.int64, count=len(builds))
        rows = np.array([[g[0].values.get(n) for n in names] for g in groups], dtype=float)
        for i, group in enumerate(groups):
            if len(group) > 1:  # several trials: their median (NaN when any lacks the figure)
                trials = np.array([[p.values.get(n) for n in names] for p in group], dtype=float)
                rows[i] = np.median(trials, axis=0)
        return cls(orders, groups, rows.reshape(len(groups), len(names)))

    def usable(self, column: int) -> np.ndarray:
        values = self.values[:, column]
        return np.flatnonzero(np.isfinite(values) & (values > 0))

    def builds(self, index: np.ndarray) -> _BuildView:
        return _BuildView(self, index)


class _BuildView(Sequence[tuple[int, list[Point]]]):
    """(order, points) of some of a table's builds, made only for the few a test looks at: building
    the list for every series of a long history cost more than the search."""

    def __init__(self, table: _BuildTable, index: np.ndarray) -> None:
        self._table, self._index = table, index

    def __len__(self) -> int:
        return int(self._index.size)

    def _at(self, i: int) -> tuple[int, list[Point]]:
        row = int(self._index[i])
        return int(self._table.orders[row]), self._table.groups[row]

    @overload
    def __getitem__(self, key: int) -> tuple[int, list[Point]]: ...
    @overload
    def __getitem__(self, key: slice) -> list[tuple[int, list[Point]]]: ...
    def __getitem__(self, key: int | slice) -> tuple[int, list[Point]] | list[tuple[int, list[Point]]]:
        if isinstance(key, slice):
            return [self._at(i) for i in range(*key.indices(len(self)))]
        return self._at(key if key >= 0 else len(self) + key)


_ITL = next(i for i, spec in enumerate(SERIES) if spec.name == "itl_p50")


def _speedup_candidates(
    variant: str, base: _BuildTable, mine: _BuildTable, samples: SampleLoader, settings: CheckSettings
) -> list[_Candidate]:
    """The base/variant token-ITL speedup over builds where both are valid: per build, base p50 over
    the variant's; its samples, base p50 over each of the variant's requests."""
    base_index, mine_index = base.usable(_ITL), mine.usable(_ITL)
    _, in_base, in_mine = np.intersect1d(
        base.orders[base_index], mine.orders[mine_index], assume_unique=True, return_indices=True
    )
    if in_mine.size < 4:
        return []
    base_itl = base.values[base_index[in_base], _ITL]
    chosen = mine_index[in_mine]
    values = base_itl / mine.values[chosen, _ITL]
    base_p50 = dict(zip(mine.orders[chosen].tolist(), base_itl.tolist(), strict=True))
    order_of = {p.id: p.order for i in chosen for p in mine.groups[i]}

    def samples_of(points: Sequence[Point]) -> list[float]:
        loaded = samples([p.id for p in points])
        return [
            base_p50[order_of[p.id]] / v for p in points for v in _pooled([p.id], loaded, "itl_ms") if v > 0
        ]

    return _series_candidates(variant, SPEEDUP, mine.builds(chosen), values, samples_of, settings)


def _family_candidates(
    points: Sequence[Point], samples: SampleLoader, settings: CheckSettings
) -> list[_Candidate]:
    by_variant: dict[str, list[Point]] = defaultdict(list)
    for point in points:
        by_variant[point.variant].append(point)
    found: list[_Candidate] = []
    tables: dict[str, _BuildTable] = {}
    for variant, points_of_variant in sorted(by_variant.items()):
        found += _validity_candidates(variant, _per_build(points_of_variant))
        table = _BuildTable.of(_per_build([p for p in points_of_variant if p.validity == VALID]))
        tables[variant] = table
        for column, spec in enumerate(SERIES):
            index = table.usable(column)
            if index.size < 4:
                continue

            def samples_of(pts: Sequence[Point], sample: str = spec.sample) -> list[float]:
                return _pooled([p.id for p in pts], samples([p.id for p in pts]), sample)

            values = table.values[index, column]
            found += _series_candidates(variant, spec, table.builds(index), values, samples_of, settings)
    base = tables.get(settings.base_variant)
    if base is not None:
        for variant, mine in tables.items():
            if variant != settings.base_variant:
                found += _speedup_candidates(variant, base, mine, samples, settings)
    return found


def _describe(cls: str, kind: str, build: str, members: Sequence[_Candidate]) -> str:
    """The one line a person reads first."""
    variants = ", ".join(sorted({c.variant for c in members}))
    if cls in (LENGTH_CAP, CORRECTNESS, CLIENT):
        reason = next(c.reason for c in members if c.reason)
        head = {LENGTH_CAP: "output length changed", CORRECTNESS: "outputs changed", CLIENT: "client"}[cls]
        if kind == FIX:
            return f"{reason} from build {build} ({variants})"
        return f"{head}: {reason} from build {build} ({variants})"
    # The headline is the first tracked series that moved (token ITL before its consequences), the
    # base variant's before the others'.
    rank = {spec.name: i for i, spec in enumerate((*SERIES, SPEEDUP))}
    tested = [c for c in members if c.evidence is not None]
    of_class = [c for c in tested if c.spec.change_class == cls] or tested
    best = min(of_class, key=lambda c: (rank.get(c.spec.name, 99), c.variant != BASE_VARIANT, c.variant))
    ev = best.evidence
    assert ev is not None  # a statistical member always has its evidence
    move = f"{ev.before:.4g} → {ev.after:.4g}" if ev.before is not None and ev.after is not None else "moved"
    factor = f" ({ev.ratio:.2f}×)" if ev.ratio else ""
    what = {REGRESSION: "worse", IMPROVEMENT: "better"}.get(kind, "changed")
    if cls == METHOD:
        what += " with a changed method (server args, environment or build flavour)"
    return f"{best.spec.label} of {ev.variant} {what} from build {build}: {move}{factor} ({variants})"


def _group(family: str, members: Sequence[_Candidate], build_names: Mapping[int, str]) -> Change:
    classes = {c.spec.change_class for c in members}
    if any(c.method_changed for c in members) and classes & {SPEED, SPEEDUP_CLASS, LENGTH_CHANGED}:
        classes.add(METHOD)
    cls = next(c for c in _CLASS_ORDER if c in classes)
    tied = [c for c in members if c.spec.change_class == cls] or list(members)
    kinds = {c.kind for c in tied}
    kind = FIX if FIX in kinds else REGRESSION if REGRESSION in kinds else IMPROVEMENT
    if cls == SPEEDUP_CLASS:
        kind = next(c.kind for c in tied)
    order = members[0].order
    last_good = max((c.last_good for c in members if c.last_good is not None), default=None)
    build = build_names.get(order, str(order))
    signals: Signals = {
        f"{c.variant}.{c.spec.name}": c.evidence.ratio for c in members if c.evidence is not None
    }
    if any(c.method_changed for c in members):
        signals["method_changed"] = True
    suspected = all(c.suspected for c in members)
    summary = _describe(cls, kind, build, members)
    if suspected:
        waits = next((c.waits_for for c in members if c.waits_for), _ONE_MORE_BUILD)
        summary += f"; suspected: {waits}"
    return Change(
        family=family,
        order=order,
        build=build,
        last_good_order=last_good,
        last_good_build=build_names.get(last_good) if last_good is not None else None,
        change_class=cls,
        kind=kind,
        summary=summary,
        state=SUSPECTED if suspected else CONFIRMED,
        evidence=[c.evidence for c in members if c.evidence is not None],
        signals=signals,
    )


def find_changes(
    points: Sequence[Point],
    samples: SampleLoader,
    settings: CheckSettings | None = None,
    explained: Mapping[str, str] | None = None,
) -> list[Change]:
    """Every change point in the history, oldest first per family: validity changes, then tested
    statistical ones, grouped per family and build. `samples` fetches raw samples by point id (only
    around candidates); `explained` maps a change id to the note that explains it."""
    settings = settings or CheckSettings()
    explained = explained or {}
    by_family: dict[str, list[Point]] = defaultdict(list)
    for point in points:
        by_family[point.family].append(point)
    changes: list[Change] = []
    for family, members in sorted(by_family.items()):
        build_names = {p.order: p.build for p in members}
        grouped: dict[int, list[_Candidate]] = defaultdict(list)
        for candidate in _family_candidates(members, samples, settings):
            grouped[candidate.order].append(candidate)
        family_changes = [_group(family, grouped[o], build_names) for o in sorted(grouped)]
        _close(family_changes)
        changes += family_changes
    annotate(changes, explained, {})
    return changes


def annotate(
    changes: Iterable[Change], explained: Mapping[str, str], culprits: Mapping[str, str | None]
) -> None:
    """What people and bisections said about changes, put onto them: a note makes a change explained
    (`track explain`), a bisection's answer is its `culprit` signal (`track bisect`)."""
    for change in changes:
        if change.id in explained:
            change.state = EXPLAINED
            change.signals["explained"] = explained[change.id]
        if change.id in culprits:
            change.signals["culprit"] = culprits[change.id]


def _moved(change: Change) -> set[tuple[str, str]]:
    return {(e.variant, e.series) for e in change.evidence}


def _close(changes: Sequence[Change]) -> None:
    """A regression is closed by a later change of its class the other way (a fix, an improvement)
    that moved one of the same series (a TTFT that recovered does not close a slower token ITL)."""
    for i, change in enumerate(changes):
        if change.kind != REGRESSION:
            continue
        for later in changes[i + 1 :]:
            same = not change.evidence or bool(_moved(change) & _moved(later))
            if later.change_class == change.change_class and later.kind in (FIX, IMPROVEMENT) and same:
                change.closed_by = later.build
                break


class PointState(NamedTuple):
    """What `blind_families` reads of a point: its family, build and validity."""

    family: str
    order: int
    validity: str
    reason: str | None
    cap: int | None


@dataclass(frozen=True)
class Blind:
    """A family whose latest builds hold no valid point: nothing in them was tested for speed, so a
    check over them can tell nothing (git bisect run's 125), never "no regression"."""

    family: str
    builds: int
    points: int
    why: dict[str, int]

    @property
    def sentence(self) -> str:
        causes = ", ".join(f"{n} of {self.points} {cause}" for cause, n in self.why.items())
        return (
            f"0 valid points in {self.builds} build(s) of family {self.family[:12]}: cannot tell — {causes}"
        )


def _cause(point: PointState) -> str:
    """A point's invalidity in a few words, so that like ones are counted together."""
    if point.validity == LENGTH:
        return f"capped at {point.cap} tokens" if point.cap else "cut short"
    if point.validity == CLIENT:
        return "timed by a saturated client"
    reason = point.reason or ""
    if "gibberish" in reason:
        return "gibberish where the baseline's outputs are clean" if "baseline" in reason else "gibberish"
    return "with failed requests" if "failed" in reason else "invalid"


def blind_families(points: Iterable[PointState], builds: int) -> list[Blind]:
    """The families none of whose latest `builds` builds (all of them, when fewer) holds a valid
    point, with how many points were invalid for what."""
    by_family: dict[str, list[PointState]] = defaultdict(list)
    for point in points:
        by_family[point.family].append(point)
    found = []
    for family, members in sorted(by_family.items()):
        latest = sorted({p.order for p in members})[-builds:]
        recent = [p for p in members if p.order >= latest[0]]
        if any(p.validity == VALID for p in recent):
            continue
        why: dict[str, int] = defaultdict(int)
        for point in recent:
            why[_cause(point)] += 1
        found.append(Blind(family, len(latest), len(recent), dict(why)))
    return found


def open_changes(changes: Iterable[Change]) -> list[Change]:
    """The confirmed regressions nobody has dealt with: neither reversed by a later build nor explained
    (a suspected one waits for another trial; `check` lists it apart)."""
    return [c for c in changes if c.kind == REGRESSION and c.closed_by is None and c.state == CONFIRMED]
