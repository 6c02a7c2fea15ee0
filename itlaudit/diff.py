"""BASE vs NEW run of the same scenario: per variant and metric, a verdict a CI gate can act on.

Pure: takes both runs' records, returns the comparison and its Markdown. Verdicts come from
`stats.compare_samples` over per-request values (one sample per request, so a long request does not
outvote a short one), the same rule `itlaudit bisect` uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from itlaudit.findings import request_findings, run_findings
from itlaudit.metrics import RequestMetrics, request_metrics
from itlaudit.records import RequestRecord
from itlaudit.stats import SAME, UNKNOWN, WORSE, Comparison, compare_samples

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


@dataclass(frozen=True)
class RunDiff:
    metrics: list[MetricDiff]
    appeared: dict[str, dict[str, int]]  # variant → finding code → count in NEW, absent from BASE
    vanished: dict[str, dict[str, int]]  # variant → finding code → count in BASE, absent from NEW
    only_base: list[str]
    only_new: list[str]

    def has(self, verdict: str) -> bool:
        return any(m.comparison.verdict == verdict for m in self.metrics)


def _finding_counts(records: Sequence[RequestRecord]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for record in records:
        found = request_findings(record, request_metrics(record))
        counts.setdefault(record.variant, Counter()).update(f.code for f in found)
    for finding in run_findings(records):
        counts.setdefault(str(finding.evidence.get("variant")), Counter())[finding.code] += 1
    return counts


def _by_variant(records: Sequence[RequestRecord]) -> dict[str, list[RequestMetrics]]:
    out: dict[str, list[RequestMetrics]] = {}
    for record in records:
        out.setdefault(record.variant, []).append(request_metrics(record))
    return out


def diff_runs(
    base: Sequence[RequestRecord],
    new: Sequence[RequestRecord],
    *,
    threshold: float = 1.1,
    alpha: float = 0.05,
) -> RunDiff:
    """Variants are matched by name, in BASE's order; a variant in one run only is listed, not judged."""
    base_names = list(dict.fromkeys(r.variant for r in base))
    new_names = list(dict.fromkeys(r.variant for r in new))
    shared = [n for n in base_names if n in new_names]
    base_metrics, new_metrics = _by_variant(base), _by_variant(new)
    rows = [
        MetricDiff(
            variant,
            metric,
            label,
            compare_samples(
                [getattr(m, metric) for m in base_metrics[variant]],
                [getattr(m, metric) for m in new_metrics[variant]],
                lower_is_better=lower,
                threshold=threshold,
                alpha=alpha,
            ),
        )
        for variant in shared
        for metric, label, lower in DIFF_METRICS
    ]
    base_found, new_found = _finding_counts(base), _finding_counts(new)
    appeared, vanished = {}, {}
    for variant in shared:
        b, n = base_found.get(variant, Counter()), new_found.get(variant, Counter())
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
    )


_ICON = {"better": "✅ better", "worse": "❌ worse", SAME: "same", UNKNOWN: "❔ unknown"}


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_diff(diff: RunDiff, base_label: str, new_label: str) -> str:
    """Markdown for a PR comment: the verdict line first, the table, then what changed in findings."""
    worse = [m for m in diff.metrics if m.comparison.verdict == WORSE]
    lines = [f"## itlaudit diff: `{_escape(new_label)}` vs `{_escape(base_label)}`", ""]
    if worse:
        lines.append("**Worse:** " + ", ".join(f"{_escape(m.variant)} {m.label}" for m in worse))
    elif diff.appeared:
        lines.append("**No metric is worse, but new findings appeared** (see below).")
    else:
        lines.append("**No metric is worse.**")
    lines += [
        "",
        "Values are medians over requests; ratio = new / base; p from a two-sided Mann–Whitney U test.",
        "",
        "| variant | metric | base | new | ratio | p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in diff.metrics:
        c = m.comparison
        ratio = "–" if c.ratio is None else f"{c.ratio:.3f}×"
        p = "–" if c.p_value is None else f"{c.p_value:.2g}"
        lines.append(
            f"| {_escape(m.variant)} | {m.label} | {_num(c.base_median)} | {_num(c.new_median)} "
            f"| {ratio} | {p} "
            f"| {_ICON.get(c.verdict, c.verdict)} |"
        )
    lines.append("")
    for title, groups in (
        ("Findings that appeared", diff.appeared),
        ("Findings that vanished", diff.vanished),
    ):
        if groups:
            lines += [f"**{title}:**", ""]
            lines += [
                f"- {_escape(v)}: " + ", ".join(f"{code} × {n}" for code, n in codes.items())
                for v, codes in groups.items()
            ]
            lines.append("")
    if diff.only_base or diff.only_new:
        lines.append(
            f"Not compared (in one run only): base {', '.join(diff.only_base) or '–'}; "
            f"new {', '.join(diff.only_new) or '–'}."
        )
    return "\n".join(lines).rstrip() + "\n"
