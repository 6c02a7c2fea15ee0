"""Writes a run's readable outputs (PNGs, report.md, report.html) into a folder.

The glue between pure parts: figures come from `analysis` (derive, metrics), pictures from `plots`, text from
`markdown`/`html`. Kept apart from `rundir` so `itlaudit report` can write a comparison of
several runs into a folder that is not itself a run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.findings import truncated_requests
from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import variant_validity
from itlaudit.model.codes import Finding
from itlaudit.model.meta import Meta
from itlaudit.model.records import RequestRecord
from itlaudit.model.redact import redact_text
from itlaudit.model.stop import requested
from itlaudit.report.context import context_facts
from itlaudit.report.html import render_html
from itlaudit.report.markdown import render_report

if TYPE_CHECKING:
    from itlaudit.report.plots import VariantView

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
# The context fact a report carries when its plots were not drawn, so a reader knows why none show.
PLOTS_SKIPPED = ("plots", "skipped (--no-plots)")

# Whether reports written now draw their PNGs. A context variable, not a parameter: the setting is the
# command's (`run --no-plots`), while the workflows derive a run's files at several points (its end,
# a signal, a failure) that all write the same report.
_DRAW_PLOTS: ContextVar[bool] = ContextVar("draw_plots", default=True)


@contextmanager
def plots_skipped(skip: bool = True) -> Iterator[None]:
    """Within this block, reports are written without PNGs (and say so): matplotlib is not imported
    and the seconds of drawing are not spent."""
    token = _DRAW_PLOTS.set(not skip)
    try:
        yield
    finally:
        _DRAW_PLOTS.reset(token)


def draws_plots() -> bool:
    """Whether a report written now draws its PNGs: not inside `plots_skipped()`, not once a signal
    came (model.stop). The step that writes it is named by it, so a signalled run does not say it
    draws plots it skips."""
    return _DRAW_PLOTS.get() and not requested()


def variant_views(
    records: Sequence[RequestRecord],
    summary: RunSummary,
    compare: CompareResult | None = None,
    findings: Sequence[Finding] = (),
    telemetry: Mapping[str, Mapping[str, Sequence[dict[str, Any]]]] | None = None,
) -> list[VariantView]:
    """compare.json is written by another command and may be absent or cut short (then
    CompareResult.from_json gave None): its spec-decode figures are then absent. The findings say
    which requests were cut short; the summary, by analysis.validity, which variants are not
    comparable."""
    from itlaudit.report.plots import VariantView  # beside matplotlib: only when plots are drawn

    truncated = truncated_requests(findings)
    views = []
    for name, block in summary.variants.items():
        row = compare.variants.get(name) if compare is not None else None
        views.append(
            VariantView(
                name=name,
                records=[r for r in records if r.variant == name],
                block=block,
                spec_decode=row.spec_decode if row is not None else None,
                truncated=frozenset(r.request_id for r in records if r.variant == name) & truncated,
                validity=variant_validity(summary, name),
                telemetry={kind: rows[name] for kind, rows in (telemetry or {}).items() if name in rows},
            )
        )
    return views


def write_reports(
    out_dir: Path,
    title: str,
    records: Sequence[RequestRecord],
    summary: RunSummary,
    findings: Sequence[Finding],
    *,
    compare: CompareResult | None = None,
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
    meta: Meta | None = None,
    telemetry: Mapping[str, Mapping[str, Sequence[dict[str, Any]]]] | None = None,
) -> Path:
    """PNGs, report.md (linking them) and report.html (embedding them); returns report.html's path.
    `meta` is the run's meta.json, for the context block (none for a comparison of several runs);
    `telemetry` the samplers' rows ({"server" or "gpu": {variant: rows}}) for the server timeline.
    Inside `plots_skipped()`, or once a signal asked the command to stop, no PNG is drawn and the
    context block says so."""
    out_dir.mkdir(parents=True, exist_ok=True)
    context = context_facts(meta, summary) if meta is not None else []
    plots: list[tuple[str, Path]] = []
    if not _DRAW_PLOTS.get():
        context.append(PLOTS_SKIPPED)
    elif requested():
        # A signal came (model.stop): the report of what finished is written, but not its plots, which
        # on a loaded box take seconds (3.6-5.8 s in the signal campaign) of the 5 s an interrupt has.
        context.append(("plots", f"not drawn: interrupted; `itlaudit report {out_dir}` draws them"))
    else:
        from itlaudit.report.plots import write_plots  # matplotlib: a second to import, only to draw

        views = variant_views(records, summary, compare, findings, telemetry)
        plots = write_plots(views, out_dir, workers=os.cpu_count() or 1)
    # A server's error message can echo a credential it was sent (an API key in a 401): redact_text
    # masks every one this process knows of.
    md = render_report(
        title, summary, findings, images=[(c, p.name) for c, p in plots], imported=imported, context=context
    )
    (out_dir / REPORT_MD).write_text(redact_text(md), encoding="utf-8")
    page = render_html(
        title,
        summary,
        findings,
        images=[(c, p.read_bytes()) for c, p in plots],
        imported=imported,
        context=context,
    )
    target = out_dir / REPORT_HTML
    target.write_text(redact_text(page), encoding="utf-8")
    return target
