"""The smoke's readable outputs (pure text): the go/no-go table and report.md."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from itlaudit.report.context import host_facts, server_fact
from itlaudit.report.markdown import table_cell
from itlaudit.smoke.checks import FAIL, PASS, SKIP, CheckResult

if TYPE_CHECKING:
    from itlaudit.smoke.runner import SmokeEnvironment, SmokeReport


def verdict_line(results: Sequence[CheckResult], runtime_s: float) -> str:
    counts = Counter(r.status for r in results)
    verdict = "NO-GO" if counts[FAIL] or not results else "GO"
    return (
        f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped "
        f"in {runtime_s:.0f} s"
    )


def table_lines(results: Sequence[CheckResult]) -> list[str]:
    """One aligned line per check: status, case, check, figure, threshold (plain text, CI-log safe),
    and a failed check's reason after it: a FAIL line says why without opening the report."""
    rows = [(r.status, r.case, r.name, r.figure, r.threshold) for r in results]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    return [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4]))
        + f"  {row[4]}"
        + (f": {result.message}" if result.status == FAIL and result.message else "")
        for row, result in zip(rows, results, strict=True)
    ]


def _environment_lines(environment: SmokeEnvironment) -> list[str]:
    """The run report's host and server facts (report.context), as this report's bullets."""
    lines = [f"- {label}: {text}" for label, text in host_facts(environment.host)]
    for name, server in environment.servers.items():
        lines.append(f"- **{name}** {server_fact(server)}")
        if server.get("non_default_args") is not None:
            lines.append(f"  - non-default args: `{json.dumps(server['non_default_args'], default=str)}`")
        if server.get("env"):
            lines.append(f"  - env: `{json.dumps(server['env'])}`")
    return lines


def render_markdown(smoke: SmokeReport, results: Sequence[CheckResult]) -> str:
    lines = [
        f"# itlaudit smoke: {smoke.suite}",
        "",
        f"**{verdict_line(results, smoke.runtime_s)}**",
        "",
        f"Suite `{smoke.suite_path}`; baseline: {smoke.baseline or 'none'}.",
        "",
        "| status | case | check | figure | threshold |",
        "|---|---|---|---|---|",
    ]
    lines += [
        "| " + " | ".join([r.status, r.case, *map(table_cell, (r.name, r.figure, r.threshold))]) + " |"
        for r in results
    ]
    failed = [r for r in results if r.status == FAIL]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- **{r.case} {table_cell(r.name)}**: {r.message}" for r in failed]
    lines += ["", "## Environment", "", *_environment_lines(smoke.environment), "", "## Runs", ""]
    for scenario, variants in smoke.results.items():
        for variant, figures in variants.items():
            lines.append(f"- {scenario}/{variant}: [{figures.run_dir}]({figures.run_dir}/report.md)")
    return "\n".join(lines) + "\n"
