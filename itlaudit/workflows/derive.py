"""Derivation of a run folder: raw requests.jsonl in, every derived file out (figures, findings, CSVs,
report). A workflow step, because it composes the store, the analysis and the report stages."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.derive import derive_requests, request_line, summarize_run, with_comparison_findings
from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.analysis.metrics import settled_records
from itlaudit.analysis.summary import PartialBy, RecordsSeen, RunSummary
from itlaudit.model.block import BlockSettings
from itlaudit.model.codes import Finding
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_context import quality_settings
from itlaudit.report.markdown import PARTIAL_HEADING
from itlaudit.report.progress import Reporter
from itlaudit.report.writer import draws_plots, write_reports
from itlaudit.store.export import write_chunks, write_table
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import read_records
from itlaudit.store.lock import Holder
from itlaudit.store.rundir import (
    CSV_FILE,
    DERIVED_FILE,
    PARTIAL_DIR,
    REQUESTS_FILE,
    SUMMARY_FILE,
    write_jsonl,
    write_versioned,
)
from itlaudit.store.server_metrics import read_telemetry, server_blocks


def _csv_rows(records: Sequence[RequestRecord], derived: Sequence[JSONObject]) -> list[dict[str, Any]]:
    """requests.csv's rows, one a request: the raw scalars and the derived figures (chunk arrays stay
    in requests.jsonl, finding details in derived.jsonl)."""
    rows = []
    for record, figures in zip(records, derived, strict=True):
        line = {**record.to_json(), **figures}
        del line["params"]  # flattened below from the record's own, typed
        params = {f.name: getattr(record.params, f.name) for f in fields(record.params)}  # no deep copy
        row = {k: v for k, v in line.items() if not isinstance(v, list | dict) and k != "text"}
        row.update({f"param_{k}": v for k, v in params.items() if not isinstance(v, list)})
        codes = figures["findings"]
        row["findings"] = ";".join(str(code) for code in codes) if isinstance(codes, list) else ""
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Derivation:
    """A run folder's figures as derived once: the records they count, the typed summary, each
    request's derived line (findings included) and every finding, for the report to draw without
    deriving again."""

    out: Path  # where the files went: the run folder, its partial/ (`report --live`), or `report --out`
    run_dir: Path  # the run folder read (its meta.json, compare.json and telemetry)
    title: str
    records: list[RequestRecord]
    summary: RunSummary
    derived: list[JSONObject]
    findings: list[Finding]  # each request's, then the run-level ones


def derive_figures(
    run_dir: Path,
    title: str,
    variant_order: Sequence[str] | None = None,
    *,
    reporter: Reporter | None = None,
    live: Holder | None = None,
    out_dir: Path | None = None,
) -> Derivation:
    """(Re)derive summary.json, derived.jsonl, requests.csv and chunks.csv from requests.jsonl, reading
    it once and computing each request's figures and findings once. `out_dir` (`report RUN --out
    DIR`) writes them there instead of into the run folder: the same files the folder would get.

    summary.json carries how many lines requests.jsonl held when it was derived (`records`), so a
    reader can tell a summary that covers the whole file from one that does not. With `live` (the run
    still writing the folder: `report --live`), every file goes to DIR/partial/ instead, titled and
    marked partial: the run's own files are the run's, and it rewrites them when it ends."""
    steps = reporter.step if reporter is not None else _unnamed
    out = run_dir / PARTIAL_DIR if live is not None else out_dir or run_dir
    with steps("deriving figures"), settled_records():
        loaded = read_records(run_dir / REQUESTS_FILE)
        records = loaded.records
        requests = derive_requests(records)
        meta = RunFiles(run_dir).meta_as_context
        summary = msgspec.structs.replace(
            summarize_run(
                records,
                variant_order,
                requests,
                quality=quality_settings(meta),
                block=BlockSettings.from_meta(meta),
                server=server_blocks(run_dir, records),
            ),
            records=RecordsSeen(file=REQUESTS_FILE, lines=loaded.lines, warmup=loaded.warmup),
            partial=None if live is None else PartialBy(pid=live.pid, host=live.host),
        )
        compared = RunFiles(run_dir).compare
        if compared is not None:  # compare.json's findings are the run's too: one set in every output
            summary = with_comparison_findings(summary, _findings(compared), records)
        derived = [request_line(request) for request in requests]
        if live is not None:
            title = f"{PARTIAL_HEADING}: {title}"
        out.mkdir(parents=True, exist_ok=True)
        write_versioned(out / SUMMARY_FILE, summary.to_json())
        write_jsonl(out / DERIVED_FILE, derived)
        write_table(out / CSV_FILE, _csv_rows(records, derived))
        write_chunks(records, out)
    findings = [f for request in requests for f in request.findings]
    findings += [Finding.from_json(f) for f in summary.run_findings]
    return Derivation(
        out=out,
        run_dir=run_dir,
        title=title,
        records=records,
        summary=summary,
        derived=derived,
        findings=findings,
    )


def _findings(comparison: CompareResult) -> list[Finding]:
    return [Finding.from_json(line) for line in comparison.findings]


def with_comparison(derivation: Derivation, comparison: CompareResult) -> Derivation:
    """The derivation with compare.json's findings merged into its summary (rewritten) and its
    findings list: what `compare` hands the terminal block and the report once compare.json exists."""
    summary = with_comparison_findings(derivation.summary, _findings(comparison), derivation.records)
    write_versioned(derivation.out / SUMMARY_FILE, summary.to_json())
    # Derivation.findings is each request's findings, then the summary's run-level ones.
    requests = derivation.findings[: len(derivation.findings) - len(derivation.summary.run_findings)]
    findings = requests + [Finding.from_json(line) for line in summary.run_findings]
    return replace(derivation, summary=summary, findings=findings)


def write_report(
    derivation: Derivation,
    *,
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
    reporter: Reporter | None = None,
) -> None:
    """The PNGs, report.md and report.html from a derivation (plus compare.json's spec-decode figures
    and meta.json's context when the run folder has them). With a reporter, the step (seconds on a
    long run) is named while it runs."""
    steps = reporter.step if reporter is not None else _unnamed
    run = RunFiles(derivation.run_dir)
    step = "drawing the plots and writing the report" if draws_plots() else "writing the report"
    with steps(step), settled_records():
        write_reports(
            derivation.out,
            derivation.title,
            derivation.records,
            derivation.summary,
            derivation.findings,
            compare=run.compare,
            imported=imported,
            meta=run.meta_if_any,
            telemetry=read_telemetry(run.path),
        )


def write_derived(
    run_dir: Path,
    title: str,
    variant_order: Sequence[str] | None = None,
    *,
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
    reporter: Reporter | None = None,
    live: Holder | None = None,
    out_dir: Path | None = None,
) -> Derivation:
    """Every derived file of a run folder: the figures (`derive_figures`), then the report."""
    derivation = derive_figures(run_dir, title, variant_order, reporter=reporter, live=live, out_dir=out_dir)
    write_report(derivation, imported=imported, reporter=reporter)
    return derivation


def _unnamed(name: str) -> AbstractContextManager[None]:
    return nullcontext()
