"""What `itlaudit report`, `diff` and `export` do with finished run folders: read them (refusing one a
run is still writing unless asked to read it live), and write one run's reports again or one report
over several. The commands parse their options and print; the figures and the rendering are
analysis/'s and report/'s."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec

from itlaudit.analysis.derive import derive_requests, summarize_run
from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.analysis.summary import PartialBy
from itlaudit.errors import RecordsError, RunDirError
from itlaudit.model.codes import Finding
from itlaudit.model.meta import Meta
from itlaudit.model.records import RequestRecord
from itlaudit.report.markdown import PARTIAL_HEADING
from itlaudit.report.progress import Reporter
from itlaudit.store.jsonl import load_records
from itlaudit.store.lock import Holder, live_holder
from itlaudit.store.rundir import (
    PARTIAL_DIR,
    REQUESTS_FILE,
    new_run_dir,
    remove_partial,
)
from itlaudit.workflows.derive import write_derived
from itlaudit.workflows.run_folder import RunFolder


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished (or, read live, a running) run folder as the reading commands use it."""

    path: Path
    title: str
    order: list[str]
    records: list[RequestRecord]
    meta: Meta
    # compare.json's findings, when the folder has one (a reader of its findings names them too)
    compared: list[Finding] = dataclasses.field(default_factory=list)


def still_written(path: Path, live: bool) -> Holder | None:
    """The run writing `path` now, if any. Without --live that is one line, not a partial reading
    taken for a finished one: the run rewrites its summary when it ends."""
    holder = live_holder(path)
    if holder is not None and not live:
        raise RunDirError(f"{holder.describe()} is still writing {path}; wait, or pass --live")
    return holder


def load_run(path: Path) -> Run:
    """A run folder is anything with a requests.jsonl; meta.json (optional) gives title and order."""
    if not path.is_dir():
        raise RecordsError(f"{path}: no such run folder")
    if not (path / REQUESTS_FILE).is_file():
        raise RecordsError(
            f"{path}: not a run folder (no {REQUESTS_FILE}); point at the folder `itlaudit run` made"
        )
    meta = RunFolder.open(path).meta_as_context  # a damaged meta.json changes no figure (fault row N27)
    return Run(
        path=path,
        title=meta.scenario or path.name,
        order=list(meta.variants),
        records=load_records(path / REQUESTS_FILE),
        meta=meta,
        compared=_compared(path),
    )


def _compared(path: Path) -> list[Finding]:
    """compare.json's findings (none without one, or one cut short: another command writes it)."""
    comparison = RunFolder.open(path).compare
    return [Finding.from_json(line) for line in comparison.findings] if comparison is not None else []


def combine_runs(runs: Sequence[Run], labels: dict[Path, str]) -> tuple[list[RequestRecord], list[str]]:
    """Several runs in one report: variant names get the run's label as prefix when they would
    otherwise collide (two runs of the same scenario), and stay short when they don't."""
    names = Counter(v for run in runs for v in dict.fromkeys(r.variant for r in run.records))
    clash = any(n > 1 for n in names.values())
    records: list[RequestRecord] = []
    order: list[str] = []
    for run in runs:
        prefix = labels[run.path]
        for record in run.records:
            if clash:
                record = dataclasses.replace(
                    record,
                    variant=f"{prefix}/{record.variant}",
                    request_id=f"{prefix}/{record.request_id}",
                )
            records.append(record)
        order += [f"{prefix}/{v}" if clash else v for v in run.order]
    return records, order


def report_runs(
    runs: Sequence[Run],
    combined: tuple[list[RequestRecord], list[str]],
    labels: dict[Path, str],
    out_dir: Path | None,
    imported: list[tuple[ImportedBenchmark, str]],
    holders: Sequence[Holder],
    reporter: Reporter,
) -> Path:
    """One run's files derived again and its reports rewritten in its folder (read live: apart, in
    DIR/partial/) or in `out_dir`, or one report over several runs (`combined`: combine_runs' records
    and variant order) in `out_dir`; the folder the reports are in."""
    if len(runs) == 1 and out_dir is None:
        run = runs[0]
        holder = holders[0] if holders else None
        write_derived(run.path, run.title, run.order, imported=imported, reporter=reporter, live=holder)
        if holder is None or live_holder(run.path) is None:
            # This reading is whole, or the run ended meanwhile and rewrote its own files: either
            # way a partial/ left beside them would only disagree with them.
            remove_partial(run.path)
            return run.path
        return run.path / PARTIAL_DIR
    if len(runs) == 1 and not holders and out_dir is not None:
        # Elsewhere, the same files an in-place report writes: its context, server section and
        # timeline come from the run folder, wherever the report goes.
        run = runs[0]
        write_derived(run.path, run.title, run.order, imported=imported, reporter=reporter, out_dir=out_dir)
        return out_dir
    records, order = combined
    target = out_dir or new_run_dir(Path("reports"), "report")
    requests = derive_requests(records)
    summary = summarize_run(records, order, requests)
    findings = [f for request in requests for f in request.findings]
    findings += [Finding.from_json(f) for f in summary.run_findings]
    titles = [run.title for run in runs]
    title = " vs ".join(titles if len(set(titles)) == len(titles) else [labels[run.path] for run in runs])
    if holders:
        title = f"{PARTIAL_HEADING}: {title}"
        summary = msgspec.structs.replace(
            summary, partial=PartialBy(pid=holders[0].pid, host=holders[0].host)
        )
    from itlaudit.report.writer import write_reports  # matplotlib: only when drawing

    with reporter.step("writing the report"):
        write_reports(target, title, records, summary, findings, imported=imported)
    return target
