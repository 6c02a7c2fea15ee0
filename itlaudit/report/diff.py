"""The diff's Markdown: the verdict a PR comment leads with, then the findings that moved, then the
table, every row with the reason for its verdict."""

from __future__ import annotations

from collections.abc import Sequence

from itlaudit.analysis.run_diff import MetricDiff, RunDiff
from itlaudit.analysis.server_metrics import SIGNAL_CHANGE, SignalChange
from itlaudit.analysis.validity import NOT_COMPARABLE
from itlaudit.model.vocabulary import Shift
from itlaudit.report.markdown import escape, table_cell

_ICON = {
    Shift.BETTER: "✅ better",
    Shift.WORSE: "❌ worse",
    Shift.SAME: "same",
    Shift.UNKNOWN: "❔ unknown",
}
_NOT_COMPARABLE = f"⚠ {NOT_COMPARABLE}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _not_comparable_lines(diff: RunDiff) -> list[str]:
    """One bold line per variant whose base or new run broke the validity rule, with the rule's
    reason: these lead, since no "better" or "same" below means anything for them."""
    lines = []
    for variant, (base, new) in diff.validity.items():
        sides = [(side, v) for side, v in (("base", base), ("new", new)) if not v.comparable]
        if sides:
            why = "; ".join(f"{side} run: {v.reason}" for side, v in sides)
            lines.append(f"**{escape(variant)}: {NOT_COMPARABLE}: {table_cell(why)}.**")
    return lines


def _verdict_cell(m: MetricDiff, comparable: bool) -> tuple[str, str]:
    """(verdict, why). A variant that is not comparable is never "better" or "same": only "worse"
    stays (a regression still fails CI); the reason shown is the test's for unknown verdicts, whose
    cause (too few requests, no significance) the reader otherwise has to guess."""
    c = m.comparison
    if not comparable and c.verdict != Shift.WORSE:
        return _NOT_COMPARABLE, "see above"
    return _ICON.get(c.verdict, c.verdict), c.reason if c.verdict == Shift.UNKNOWN else ""


def why_it_moved(moved: Sequence[SignalChange]) -> list[str]:
    """The server and GPU signals that changed between the runs (summary.json's `server` blocks):
    what the server was doing differently while the figures above moved. Listed, never judged."""
    if not moved:
        return []
    lines = [
        "### Why it moved",
        "",
        f"Server and GPU signals that changed by more than {SIGNAL_CHANGE:.0%} between the runs' measured "
        "windows (/metrics sampled during them, per-request acceptance, NVML):",
        "",
        "| variant | signal | base | new | ratio |",
        "|---|---|---|---|---|",
    ]
    for change in moved:
        ratio = "–" if change.ratio is None else f"{change.ratio:.2f}×"
        lines.append(
            f"| {escape(change.variant)} | {escape(change.label)} | {escape(change.base)} "
            f"| {escape(change.new)} | {ratio} |"
        )
    return [*lines, ""]


def render_diff(diff: RunDiff, base_label: str, new_label: str, moved: Sequence[SignalChange] = ()) -> str:
    """Markdown for a PR comment: which variants are not comparable, the verdict line, what changed
    in findings, then the table, then why it moved (`moved`: the server signals that changed).
    Labels in argument order: base, then new."""
    worse = [m for m in diff.metrics if m.comparison.verdict == Shift.WORSE]
    lines = [f"## itlaudit diff: `{escape(base_label)}` (base) → `{escape(new_label)}` (new)", ""]
    unlike = _not_comparable_lines(diff)
    lines += [*unlike, ""] if unlike else []
    if worse:
        lines.append("**Worse:** " + ", ".join(f"{escape(m.variant)} {m.label}" for m in worse))
    elif diff.appeared:
        lines.append("**No metric is worse, but new findings appeared** (see below).")
    elif unlike:
        lines.append("No metric is worse, which says nothing about the variants above.")
    else:
        lines.append("**No metric is worse.**")
    lines.append("")
    for title, groups in (
        ("Findings that appeared", diff.appeared),
        ("Findings that vanished", diff.vanished),
    ):
        if groups:
            lines += [f"**{title}:**", ""]
            lines += [
                f"- {escape(v)}: " + ", ".join(f"{code} × {n}" for code, n in codes.items())
                for v, codes in groups.items()
            ]
            lines.append("")
    lines += [
        "Values are medians over requests; ratio = new / base, with its 95% bootstrap interval (each "
        "run's requests resampled); p from a two-sided Mann–Whitney U test (exact for small samples). "
        "A verdict needs p < α and a ratio beyond the threshold.",
        "",
        "| variant | metric | base | new | ratio | 95% CI | p | verdict | why |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in diff.metrics:
        c = m.comparison
        ratio = "–" if c.ratio is None else f"{c.ratio:.3f}×"
        p = "–" if c.p_value is None else f"{c.p_value:.2g}"
        ci = "–" if m.ratio_interval is None else f"[{m.ratio_interval[0]:.3f}, {m.ratio_interval[1]:.3f}]"
        verdict, why = _verdict_cell(m, diff.comparable(m.variant))
        lines.append(
            f"| {escape(m.variant)} | {m.label} | {_num(c.base_median)} | {_num(c.new_median)} "
            f"| {ratio} | {ci} | {p} | {verdict} | {table_cell(why)} |"
        )
    lines.append("")
    lines += why_it_moved(moved)
    if diff.only_base or diff.only_new:
        lines.append(
            f"Not compared (in one run only): base {', '.join(diff.only_base) or '–'}; "
            f"new {', '.join(diff.only_new) or '–'}."
        )
    return "\n".join(lines).rstrip() + "\n"
