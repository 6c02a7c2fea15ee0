"""Check evaluation (pure): per-variant figures in, PASS/FAIL/SKIP results with evidence out.

Figures are plain JSON (they are written to smoke.json and read back as a later smoke's baseline),
so a check sees the same numbers whether they were measured a second ago or last release.
A check that cannot find its figure fails rather than passes: an unverifiable release is no-go.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import msgspec

from itlaudit.analysis.comparison import VariantComparison
from itlaudit.analysis.derive import derive_requests
from itlaudit.analysis.summary import VariantSummary
from itlaudit.analysis.validity import BlockCounts, block_validity
from itlaudit.model.codes import Finding
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.vocabulary import QualityGate
from itlaudit.smoke.suite import DEFAULT_METRIC, CheckParams, CheckSpec, Suite

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# Enough examples to show a pattern in a JUnit failure without burying it.
MAX_EXAMPLES = 3


class RequestOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one request ended, as the length and finish-reason checks judge it."""

    request_id: str
    status: str
    completion_tokens: int | None
    finish_reason: str | None
    error: str | None


class FindingExample(msgspec.Struct, frozen=True, kw_only=True):
    """One finding's message, kept as evidence of its code."""

    request_id: str | None
    message: str


class AcceptanceFigures(msgspec.Struct, frozen=True, kw_only=True):
    """Acceptance length from the server's /metrics window and from the stream (decode tokens/chunk)."""

    metrics: float | None
    stream: float | None


class VariantFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the checks read for one scenario on one server: smoke.json's `results` entry (a later
    smoke's baseline reads it back), field order the file's."""

    run_dir: str  # the pass's run folder, relative to the smoke's folder
    requests: int
    errors: int
    max_tokens: int | None
    per_request: list[RequestOutcome]
    findings: dict[str, int]
    finding_examples: dict[str, list[FindingExample]]
    metrics: dict[str, dict[str, float | int | None]]  # METRIC → STAT → value (no count)
    acceptance_length: AcceptanceFigures
    # the server block's memory-bandwidth floor (analysis.roofline): ms a K0 token cannot beat, and the
    # token ITL's share of it; None where the run knew no model config or bandwidth (an older smoke.json)
    floor_ms: float | None = None
    floor_share: float | None = None

    def validity_block(self) -> BlockCounts:
        """The counts analysis.validity's rule reads from a summary block."""
        return {"requests": self.requests, "errors": self.errors, "findings": self.findings}


Results = dict[str, dict[str, VariantFigures]]  # scenario → variant → figures


@dataclass(frozen=True)
class CheckResult:
    name: str
    scenario: str
    variant: str
    kind: str
    status: str
    figure: str
    threshold: str
    value: float | int | str | None = None
    message: str = ""
    evidence: JSONObject = field(default_factory=dict)

    @property
    def case(self) -> str:
        return f"{self.scenario}/{self.variant}"

    def to_json(self) -> JSONObject:
        return asdict(self)


def variant_figures(
    run_dir: str,
    records: Sequence[RequestRecord],
    block: VariantSummary,
    compare_row: VariantComparison | None,
    extra_findings: Sequence[Finding],
    max_tokens: int | None,
    server: Mapping[str, Any] | None = None,
) -> VariantFigures:
    """What the checks read for one scenario on one server: the variant's summary block, its
    compare.json row, and the findings with a few of their messages as evidence."""
    details = [f for d in derive_requests(records) for f in d.findings] + list(extra_findings)
    counts = Counter(block.findings)
    counts.update(f.code for f in extra_findings)
    examples: dict[str, list[FindingExample]] = {}
    for detail in details:
        kept = examples.setdefault(detail.code, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(FindingExample(request_id=detail.request_id, message=detail.message))
    spec = compare_row.spec_decode if compare_row else None
    metrics_length = spec.acceptance_length if spec is not None else None
    return VariantFigures(
        run_dir=run_dir,
        requests=len(records),
        errors=sum(r.status != Status.OK for r in records),
        max_tokens=max_tokens,
        per_request=[
            RequestOutcome(
                request_id=r.request_id,
                status=r.status,
                completion_tokens=r.completion_tokens,
                finish_reason=r.finish_reason,
                error=r.error,
            )
            for r in records
        ],
        findings=dict(sorted(counts.items())),
        finding_examples=examples,
        metrics={
            name: {stat: value for stat, value in stats.items() if stat != "count"}
            for name, stats in block.distributions.items()
            if "p50" in stats
        },
        acceptance_length=AcceptanceFigures(
            metrics=float(metrics_length) if isinstance(metrics_length, int | float) else None,
            stream=compare_row.stream_acceptance_length if compare_row else None,
        ),
        floor_ms=_float((server or {}).get("floor_ms")),
        floor_share=_float((server or {}).get("floor_share")),
    )


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _metric(figures: VariantFigures | None, path: str) -> float | None:
    name, _, stat = path.partition(".")
    value = (figures.metrics.get(name) or {}).get(stat) if figures is not None else None
    return float(value) if value is not None else None


def _unit(path: str) -> str:
    """The unit a metric's name carries (`itl_ms.p50` is in ms), as printed after a number."""
    name = path.partition(".")[0]
    return " ms" if name.endswith("_ms") else " tokens/s" if name.endswith("_per_s") else ""


def _ratio(value: float, path: str, this: float, against: str) -> str:
    """A ratio check's figure: `2.64× (0.757 ms vs K0 2 ms)`, units read from the metric's name."""
    return f"{value:.3g}× ({_num(this, _unit(path))} vs {against})"


def _num(value: float | None, unit: str = "") -> str:
    return "–" if value is None else f"{value:.3g}{unit}"


def _bounds(params: CheckParams, unit: str = "") -> str:
    parts = []
    if params.equals is not None:
        parts.append(f"= {params.equals}{unit}")
    if params.min is not None:
        parts.append(f"≥ {params.min}{unit}")
    if params.max is not None:
        parts.append(f"≤ {params.max}{unit}")
    return ", ".join(parts)


def _within(value: float, params: CheckParams) -> bool:
    return (
        (params.equals is None or value == params.equals)
        and (params.min is None or value >= params.min)
        and (params.max is None or value <= params.max)
    )


def _bad_requests(figures: VariantFigures, ok: Callable[[RequestOutcome], bool]) -> list[RequestOutcome]:
    return [r for r in figures.per_request if not ok(r)]


@dataclass(frozen=True)
class _Ctx:
    spec: CheckSpec
    figures: VariantFigures
    others: dict[str, VariantFigures]  # the scenario's other variants
    baseline: VariantFigures | None  # this scenario/variant in the baseline smoke, if any
    has_baseline: bool


class Outcome(NamedTuple):
    """One check's judgement on one case, before it is named (CheckResult)."""

    status: str
    figure: str
    threshold: str
    value: float | int | str | None
    message: str
    evidence: JSONObject


def _json(value: object) -> JSONValue:
    """Figures as smoke.json and the JUnit evidence write them."""
    data: JSONValue = msgspec.to_builtins(value)
    return data


def _completion_tokens(ctx: _Ctx) -> Outcome:
    params = ctx.spec.params
    if params.equals is None and params.min is None and params.max is None:
        params = CheckParams(equals=ctx.figures.max_tokens)
    counts = [r.completion_tokens for r in ctx.figures.per_request]
    known = [c for c in counts if c is not None]

    def ok(r: RequestOutcome) -> bool:
        return (
            r.status == Status.OK and r.completion_tokens is not None and _within(r.completion_tokens, params)
        )

    bad = _bad_requests(ctx.figures, ok)
    low, high = (min(known), max(known)) if known else (None, None)
    figure = f"{low}..{high} tokens" if low != high else f"{low} tokens"
    status = PASS if counts and not bad else FAIL
    message = (
        f"{len(bad)} of {len(counts)} requests returned a length outside {_bounds(params)}: "
        + "; ".join(
            f"{r.request_id} {r.completion_tokens} tokens, {r.finish_reason or r.status}"
            for r in bad[:MAX_EXAMPLES]
        )
        if bad
        else ""
    )
    return Outcome(status, figure, _bounds(params), low, message, {"bad_requests": _json(bad)})


def _finish_reason(ctx: _Ctx) -> Outcome:
    wanted = ctx.spec.params.equals
    reasons = Counter(r.finish_reason or r.status for r in ctx.figures.per_request)
    bad = _bad_requests(ctx.figures, lambda r: r.finish_reason == wanted)
    figure = ", ".join(f"{k}×{v}" for k, v in sorted(reasons.items())) or "no requests"
    message = (
        f"{len(bad)} of {sum(reasons.values())} requests did not finish with {wanted!r} ({figure})"
        if bad
        else ""
    )
    status = PASS if reasons and not bad else FAIL
    evidence: JSONObject = {"finish_reasons": _json(dict(reasons)), "bad_requests": _json(bad)}
    return Outcome(status, figure, f"= {wanted}", figure, message, evidence)


def _no_finding(ctx: _Ctx) -> Outcome:
    found = ctx.figures.findings
    hits = {c: found.get(c, 0) for c in ctx.spec.params.codes if found.get(c)}
    examples = {c: ctx.figures.finding_examples.get(c, []) for c in hits}
    figure = ", ".join(f"{c}×{n}" for c, n in hits.items()) or "none"
    message = " | ".join(f"{c}: {ex[0].message}" for c, ex in examples.items() if ex)
    evidence: JSONObject = {"findings": _json(hits), "examples": _json(examples)}
    return Outcome((FAIL if hits else PASS), figure, "0 findings", sum(hits.values()), message, evidence)


def _metric_check(ctx: _Ctx) -> Outcome:
    path = ctx.spec.params.metric or DEFAULT_METRIC
    value = _metric(ctx.figures, path)
    threshold = _bounds(ctx.spec.params)
    if value is None:
        return Outcome(
            FAIL, "–", threshold, None, f"{path} has no value (no finished request measured it)", {}
        )
    status = PASS if _within(value, ctx.spec.params) else FAIL
    message = f"{path} is {value:.4g}, outside {threshold}" if status == FAIL else ""
    return Outcome(status, _num(value), threshold, value, message, {path: value})


def _speedup(ctx: _Ctx) -> Outcome:
    params = ctx.spec.params
    path = params.metric or DEFAULT_METRIC
    over = params.over or ""
    least = params.min or 0.0
    this, base = _metric(ctx.figures, path), _metric(ctx.others.get(over), path)
    threshold = f"≥ {params.min}×"
    evidence: JSONObject = {path: this, f"{over} {path}": base}
    # analysis.validity: a capped or failing variant's ITL is no speed, so no speedup to pass on.
    other = ctx.others.get(over)
    # Quality is judged relatively (the variant against the one it is compared over); a suite whose
    # model writes gibberish by construction may still say `gibberish_expected` to turn it off.
    gate = QualityGate.OFF if params.gibberish_expected else QualityGate.RELATIVE
    theirs = other.validity_block() if other else BlockCounts()
    sides = (
        ("this variant", block_validity(ctx.figures.validity_block(), base=theirs or None, gate=gate)),
        (over, block_validity(theirs, gate=gate)),
    )
    unlike = [f"{name} {v.label}" for name, v in sides if not v.comparable]
    if unlike:
        return Outcome(FAIL, "–", threshold, None, "; ".join(unlike) + ", so no speedup", evidence)
    if this is None or not base or not this:
        message = f"{path} is missing here or on {over}, so no speedup"
        return Outcome(FAIL, "–", threshold, None, message, evidence)
    value = base / this
    status = PASS if value >= least else FAIL
    message = (
        f"{path} {this:.4g}{_unit(path)} vs {over} {base:.4g}{_unit(path)}: speedup {value:.3g}× is below "
        f"{threshold}"
        if status == FAIL
        else ""
    )
    figure = _ratio(value, path, this, f"{over} {_num(base, _unit(path))}")
    return Outcome(status, figure, threshold, value, message, evidence)


def _acceptance(ctx: _Ctx) -> Outcome:
    figures = ctx.figures.acceptance_length
    source = "/metrics" if figures.metrics is not None else "stream"
    value = figures.metrics if source == "/metrics" else figures.stream
    least = ctx.spec.params.min or 0.0
    threshold = f"≥ {ctx.spec.params.min}"
    evidence: JSONObject = {"metrics": figures.metrics, "stream": figures.stream}
    if value is None:
        message = "no acceptance length: no spec-decode counters and no decode chunks"
        return Outcome(FAIL, "–", threshold, None, message, evidence)
    status = PASS if value >= least else FAIL
    message = f"acceptance length {value:.3g} ({source}) is below {threshold}" if status == FAIL else ""
    return Outcome(status, f"{value:.3g} ({source})", threshold, value, message, evidence)


def _bandwidth_floor(ctx: _Ctx) -> Outcome:
    """The variant's token ITL as a share of its memory-bandwidth floor (1 is the roofline): a
    threshold that rests on the device's bandwidth and the model's bytes, not on a past measurement."""
    share, floor = ctx.figures.floor_share, ctx.figures.floor_ms
    least = ctx.spec.params.min or 0.0
    threshold = f"≥ {least:.0%} of the floor"
    evidence: JSONObject = {"floor_ms": floor, "floor_share": share}
    if share is None or floor is None:
        message = (
            "no bandwidth floor: the run knew no model config.json or no device bandwidth "
            "(give the scenario model_config / mem_bandwidth_gbps; docs/roofline.md)"
        )
        return Outcome(FAIL, "–", threshold, None, message, evidence)
    status = PASS if share >= least else FAIL
    figure = f"{share:.0%} of {floor:.3g} ms"
    message = (
        f"token ITL {floor / share:.4g} ms is {share:.0%} of the bandwidth floor {floor:.3g} ms, "
        f"below {threshold}"
        if status == FAIL
        else ""
    )
    return Outcome(status, figure, threshold, share, message, evidence)


def _baseline(ctx: _Ctx) -> Outcome:
    path = ctx.spec.params.metric or DEFAULT_METRIC
    limit = ctx.spec.params.max_ratio or 0.0
    threshold = f"≤ {ctx.spec.params.max_ratio}× baseline"
    if not ctx.has_baseline:
        return Outcome(
            SKIP, "no baseline", threshold, None, "pass --baseline PREVIOUS/smoke.json to compare", {}
        )
    this, base = _metric(ctx.figures, path), _metric(ctx.baseline, path)
    evidence: JSONObject = {path: this, f"baseline {path}": base}
    if base is None or not base:
        message = f"the baseline has no {path} for this case"
        return Outcome(SKIP, "not in baseline", threshold, None, message, evidence)
    if this is None:
        return Outcome(FAIL, "–", threshold, None, f"{path} has no value in this run", evidence)
    value = this / base
    status = PASS if value <= limit else FAIL
    message = (
        f"{path} {this:.4g}{_unit(path)} vs baseline {base:.4g}{_unit(path)}: {value:.3g}× exceeds "
        f"{threshold}"
        if status == FAIL
        else ""
    )
    figure = _ratio(value, path, this, f"baseline {_num(base, _unit(path))}")
    return Outcome(status, figure, threshold, value, message, evidence)


_EVALUATORS: dict[str, Callable[[_Ctx], Outcome]] = {
    "completion_tokens": _completion_tokens,
    "finish_reason": _finish_reason,
    "no_finding": _no_finding,
    "metric": _metric_check,
    "speedup": _speedup,
    "acceptance_length": _acceptance,
    "bandwidth_floor": _bandwidth_floor,
    "baseline": _baseline,
}


def _label(spec: CheckSpec) -> str:
    if spec.name:
        return spec.name
    if spec.kind == "speedup":
        return f"speedup {spec.params.metric or DEFAULT_METRIC} over {spec.params.over}"
    if spec.kind in ("metric", "baseline"):
        return f"{spec.kind} {spec.params.metric or DEFAULT_METRIC}"
    if spec.kind == "no_finding":
        codes = spec.params.codes
        return f"no {'/'.join(codes)}" if len(codes) <= 2 else f"no findings ({len(codes)} codes)"
    return spec.kind


def evaluate(suite: Suite, results: Results, baseline: Results | None) -> list[CheckResult]:
    """Every check of the suite, expanded over the scenarios and variants it applies to."""
    out = []
    for spec in suite.checks:
        scenarios = [spec.scenario] if spec.scenario else [s.name for s in suite.scenarios]
        for scenario in scenarios:
            ran = results.get(scenario, {})
            variants = [spec.variant] if spec.variant else list(ran)
            if spec.kind == "speedup" and not spec.variant:
                variants = [v for v in variants if v != spec.params.over]
            for variant in variants:
                if variant not in ran:
                    continue
                ctx = _Ctx(
                    spec=spec,
                    figures=ran[variant],
                    others=ran,
                    baseline=(baseline or {}).get(scenario, {}).get(variant),
                    has_baseline=baseline is not None,
                )
                status, figure, threshold, value, message, evidence = _EVALUATORS[spec.kind](ctx)
                out.append(
                    CheckResult(
                        name=_label(spec),
                        scenario=scenario,
                        variant=variant,
                        kind=spec.kind,
                        status=status,
                        figure=figure,
                        threshold=threshold,
                        value=value,
                        message=message,
                        evidence={**evidence, "run_dir": ran[variant].run_dir},
                    )
                )
    return out


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 go, 1 no-go; SKIPs do not block (a missing baseline is not a regression)."""
    return 1 if any(r.status == FAIL for r in results) or not results else 0
