"""The diff's Markdown: the verdict a PR comment leads with, then the table and the findings that moved."""

from __future__ import annotations

from itlaudit.analysis.run_diff import RunDiff
from itlaudit.analysis.stats import Verdict
from itlaudit.report.markdown import escape

__all__ = ["render_diff"]

_ICON = {
    Verdict.BETTER: "✅ better",
    Verdict.WORSE: "❌ worse",
    Verdict.SAME: "same",
    Verdict.UNKNOWN: "❔ unknown",
}


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def render_diff(diff: RunDiff, base_label: str, new_label: str) -> str:
    """Markdown for a PR comment: the verdict line first, the table, then what changed in findings."""
    worse = [m for m in diff.metrics if m.comparison.verdict == Verdict.WORSE]
    lines = [f"## itlaudit diff: `{escape(new_label)}` vs `{escape(base_label)}`", ""]
    if worse:
        lines.append("**Worse:** " + ", ".join(f"{escape(m.variant)} {m.label}" for m in worse))
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
            f"| {escape(m.variant)} | {m.label} | {_num(c.base_median)} | {_num(c.new_median)} "
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
                f"- {escape(v)}: " + ", ".join(f"{code} × {n}" for code, n in codes.items())
                for v, codes in groups.items()
            ]
            lines.append("")
    if diff.only_base or diff.only_new:
        lines.append(
            f"Not compared (in one run only): base {', '.join(diff.only_base) or '–'}; "
            f"new {', '.join(diff.only_new) or '–'}."
        )
    return "\n".join(lines).rstrip() + "\n"
