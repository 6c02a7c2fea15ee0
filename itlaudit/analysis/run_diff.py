"""BASE vs NEW run of the same scenario: per variant and metric, a verdict a CI gate can act on.

Pure: takes both runs' records, returns the comparison and its Markdown. Verdicts come from
`stats.compare_samples` over per-request values (one sample per request, so a long request does not
outvote a short one), the same rule `itlaudit bisect` uses.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from itlaudit.analysis.convergence import median_ratio_interval
from itlaudit.analysis.derive import JUDGED_RELATIVELY, summarize_run, with_comparison_findings
from itlaudit.analysis.metrics import RequestMetrics, request_metrics
from itlaudit.analysis.stats import Comparison, compare_samples
from itlaudit.analysis.validity import Validity, variant_validity
from itlaudit.model.codes import Finding
from itlaudit.model.meta import Meta
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.run_context import QualitySettings
from itlaudit.model.vocabulary import Shift

ERROR_RATE = ("error_rate", "error rate")
# Workload fields a run's fingerprint carries (ledger.variant_fingerprint); num_requests is left out,
# since more requests of the same workload only sharpen the comparison.
_FINGERPRINT_WORKLOAD_KEYS = ("prompts_sha256", "concurrency", "extra_body")

# (metric, label, lower is better). completion_tokens: fewer than the base means a cap or an early
# stop crept in, which is the regression that fakes a slowdown, so a drop counts as worse.
DIFF_METRICS = (
    ("itl_ms", "token ITL (ms)", True),
    ("chunk_itl_ms", "chunk ITL (ms)", True),
    ("ttft_ms", "TTFT (ms)", True),
    ("tpot_ms", "TPOT (ms)", True),
    ("e2e_ms", "E2E (ms)", True),
    ("decode_tokens_per_s", "decode tokens/s", False),
    ("tokens_per_chunk", "tokens per chunk", False),
    ("completion_tokens", "completion tokens", False),
)


@dataclass(frozen=True)
class MetricDiff:
    variant: str
    metric: str
    label: str
    comparison: Comparison
    # the 95% bootstrap interval of the ratio (analysis.convergence), where the samples allow one
    ratio_interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class RunDiff:
    metrics: list[MetricDiff]
    appeared: dict[str, dict[str, int]]  # variant → finding code → count in NEW, absent from BASE
    vanished: dict[str, dict[str, int]]  # variant → finding code → count in BASE, absent from NEW
    only_base: list[str]
    only_new: list[str]
    # variant → (base run's validity, new run's validity), by the one rule of analysis.validity: a
    # variant cut short, failing or gibberish on either side compares unlike workloads.
    validity: dict[str, tuple[Validity, Validity]] = field(default_factory=dict)

    def has(self, verdict: str) -> bool:
        return any(m.comparison.verdict == verdict for m in self.metrics)

    def comparable(self, variant: str) -> bool:
        return all(v.comparable for v in self.validity.get(variant, ()))


def _by_variant(records: Sequence[RequestRecord]) -> dict[str, list[RequestMetrics]]:
    out: dict[str, list[RequestMetrics]] = {}
    for record in records:
        out.setdefault(record.variant, []).append(request_metrics(record))
    return out


def error_rate_comparison(base: Sequence[RequestRecord], new: Sequence[RequestRecord]) -> Comparison:
    """Failed requests / requests. Any rise is worse: a benchmark's requests are not supposed to fail,
    and a new run whose requests all failed has no latency left to judge, so this is its only verdict."""
    b_failed = sum(r.status != Status.OK for r in base)
    n_failed = sum(r.status != Status.OK for r in new)
    b_rate, n_rate = b_failed / len(base), n_failed / len(new)
    ratio = n_rate / b_rate if b_rate > 0 else None
    verdict = Shift.WORSE if n_rate > b_rate else Shift.BETTER if n_rate < b_rate else Shift.SAME
    reason = f"{n_failed} of {len(new)} requests failed vs {b_failed} of {len(base)}"
    return Comparison(verdict, ratio, None, b_rate, n_rate, len(base), len(new), reason)


def workload_of(meta: Meta, records: Sequence[RequestRecord]) -> dict[str, object]:
    """What a run asked the server for, from its meta.json and records: two runs compare only when
    this matches (the server and build are what a diff is meant to vary)."""
    stored = [info.fingerprint.get("workload") for info in meta.variants.values() if info.fingerprint]
    fingerprinted = next((w for w in stored if isinstance(w, Mapping) and w), {})
    return {
        "scenario": meta.scenario,
        "endpoint": sorted({r.endpoint for r in records}) or None,
        "model": sorted({r.model for r in records}) or None,
        "params": sorted({json.dumps(asdict(r.params), sort_keys=True) for r in records}) or None,
        **{key: fingerprinted.get(key) for key in _FINGERPRINT_WORKLOAD_KEYS},
    }


def workload_differences(base: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """`key base vs new` for each field known in both runs that differs."""
    return [
        f"{key} {_shown(base[key])} vs {_shown(new[key])}"
        for key in base
        if base.get(key) is not None and new.get(key) is not None and base[key] != new[key]
    ]


def _shown(value: object) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def diff_runs(
    base: Sequence[RequestRecord],
    new: Sequence[RequestRecord],
    *,
    threshold: float = 1.1,
    alpha: float = 0.05,
    compared: tuple[Sequence[Finding], Sequence[Finding]] = ((), ()),
    quality: tuple[QualitySettings, QualitySettings] = (JUDGED_RELATIVELY, JUDGED_RELATIVELY),
) -> RunDiff:
    """Variants are matched by name, in BASE's order; a variant in one run only is listed, not judged.
    `compared` is each run's compare.json findings and `quality` its meta.json's quality settings, so
    the findings and the validity diffed are the ones each run's own report names."""
    base_names = list(dict.fromkeys(r.variant for r in base))
    new_names = list(dict.fromkeys(r.variant for r in new))
    shared = [n for n in base_names if n in new_names]
    base_metrics, new_metrics = _by_variant(base), _by_variant(new)
    rows = []
    for variant in shared:
        for metric, label, lower in DIFF_METRICS:
            before = [getattr(m, metric) for m in base_metrics[variant]]
            after = [getattr(m, metric) for m in new_metrics[variant]]
            comparison = compare_samples(
                before, after, lower_is_better=lower, threshold=threshold, alpha=alpha
            )
            rows.append(MetricDiff(variant, metric, label, comparison, median_ratio_interval(before, after)))
    by_variant_base = {n: [r for r in base if r.variant == n] for n in shared}
    by_variant_new = {n: [r for r in new if r.variant == n] for n in shared}
    rows += [
        MetricDiff(
            variant, *ERROR_RATE, error_rate_comparison(by_variant_base[variant], by_variant_new[variant])
        )
        for variant in shared
    ]
    base_summary, new_summary = (
        with_comparison_findings(summarize_run(records, quality=settings), found, records)
        for records, found, settings in zip((base, new), compared, quality, strict=True)
    )
    appeared, vanished = {}, {}
    for variant in shared:
        b = Counter(base_summary.variants[variant].findings)
        n = Counter(new_summary.variants[variant].findings)
        if added := {code: count for code, count in n.items() if code not in b}:
            appeared[variant] = added
        if gone := {code: count for code, count in b.items() if code not in n}:
            vanished[variant] = gone
    return RunDiff(
        metrics=rows,
        appeared=appeared,
        vanished=vanished,
        only_base=[n for n in base_names if n not in new_names],
        only_new=[n for n in new_names if n not in base_names],
        validity={v: (variant_validity(base_summary, v), variant_validity(new_summary, v)) for v in shared},
    )
