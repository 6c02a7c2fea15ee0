"""`itlaudit report`, `diff` and `export`: the commands that read finished run folders.

Argument checks and printing live here; reading run folders and writing reports over them are
workflows/report.py's, the figures, verdicts and rendering the pure modules'.
A folder a run is still writing (store.lock) is refused with one line unless `--live`, which reads
what has finished so far and writes it apart from the run's own files, marked partial.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias

import typer
from rich.console import Console

from itlaudit.analysis.importers import ImportedBenchmark, parse_import
from itlaudit.analysis.run_diff import diff_runs, workload_differences, workload_of
from itlaudit.analysis.server_metrics import signal_changes
from itlaudit.cli.options import choices
from itlaudit.errors import RecordsError
from itlaudit.model.run_context import quality_settings
from itlaudit.model.vocabulary import Shift
from itlaudit.report.diff import render_diff
from itlaudit.report.markdown import PARTIAL_HEADING
from itlaudit.report.progress import Reporter
from itlaudit.store.export import CHUNK_FORMATS, write_chunks
from itlaudit.store.lock import refuse_if_live
from itlaudit.store.rundir import PARTIAL_DIR
from itlaudit.store.server_metrics import server_blocks
from itlaudit.workflows.report import Run, combine_runs, load_run, report_runs, still_written

out = Console()
FAIL_ON = (Shift.WORSE, Shift.UNKNOWN, "findings")
if TYPE_CHECKING:
    FailOn: TypeAlias = str
    ChunkFormat: TypeAlias = str
else:
    FailOn = choices("FailOn", FAIL_ON)
    ChunkFormat = choices("ChunkFormat", CHUNK_FORMATS)


LiveOption = Annotated[
    bool,
    typer.Option(
        "--live",
        help="Read a folder a run is still writing: what has finished so far, marked partial, written "
        "apart from the run's own files (DIR/partial/).",
    ),
]


def load_import(spec: str, default_variant: str) -> tuple[ImportedBenchmark, str]:
    """`[VARIANT=]PATH`: which variant of the run the other tool measured (default: the first)."""
    variant, sep, path_text = spec.rpartition("=")
    path = Path(path_text if sep else spec)
    if not path.is_file():
        raise RecordsError(f"--import {spec}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordsError(f"--import {path}: not JSON ({exc})") from None
    return parse_import(data, path.name), (variant if sep and variant else default_variant)


def _run_labels(specs: list[str], runs: list[Run]) -> dict[Path, str]:
    """`--label NAME=DIR`: a short name for a run folder; otherwise the run's own label (meta.json),
    else its folder name (long: `mtp-long-decode-20261204T030116Z`)."""
    given: dict[Path, str] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise RecordsError(f"--label {spec}: expected NAME=DIR")
        given[Path(folder).resolve()] = name
    unknown = set(given) - {run.path.resolve() for run in runs}
    if unknown:
        raise RecordsError(
            f"--label: {', '.join(sorted(map(str, unknown)))} is not one of the run folders given"
        )
    return {run.path: given.get(run.path.resolve()) or (run.meta.label or run.path.name) for run in runs}


def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run folders (requests.jsonl inside).")],
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Output folder (default: the run folder; reports/report-<time>/ for several)."
        ),
    ] = None,
    imports: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            help="[VARIANT=]FILE: a `vllm bench serve` result JSON or AIPerf profile_export_aiperf.json "
            "to put beside VARIANT (default the first).",
        ),
    ] = None,
    label_specs: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="NAME=DIR",
            help="A short name for run folder DIR in a report over several (default: the run's label, "
            "else the folder's name). Repeatable.",
        ),
    ] = None,
    live: LiveOption = False,
) -> None:
    """Re-derive a run's files and write report.md, report.html and PNGs (several runs: one comparison)."""
    holders = [h for h in (still_written(p, live) for p in run_dirs) if h is not None]
    if out_dir is not None:
        refuse_if_live(out_dir, f"--out {out_dir}")
    runs = [load_run(p) for p in run_dirs]
    labels = _run_labels(label_specs or [], runs)
    records, order = combine_runs(runs, labels)
    first = order[0] if order else (records[0].variant if records else "")
    imported = [load_import(spec, first) for spec in imports or []]
    steps = Reporter(Console(stderr=True))  # a spinner, or lines in a log: drawing takes seconds
    target = report_runs(runs, (records, order), labels, out_dir, imported, holders, steps)
    for name in ("report.md", "report.html"):  # both, absolute: as `run` prints them
        out.print(f"report: {(target / name).resolve()}", markup=False, highlight=False, soft_wrap=True)


def diff(
    base_dir: Annotated[Path, typer.Argument(help="The baseline run folder.")],
    new_dir: Annotated[Path, typer.Argument(help="The run to judge against it (same scenario).")],
    fail_on: Annotated[
        list[FailOn] | None,
        typer.Option(help="Exit 1 when any metric is worse / unknown, or on new findings. Repeatable."),
    ] = None,
    threshold: Annotated[
        float, typer.Option(metavar="R", help="Smallest ratio of medians that counts (1.1 = 10 %).")
    ] = 1.1,
    alpha: Annotated[float, typer.Option(help="Significance level of the Mann–Whitney U test.")] = 0.05,
    out_file: Annotated[Path | None, typer.Option("--out", help="Also write the Markdown here.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Compare even when the two runs' workloads differ.")
    ] = False,
    live: LiveOption = False,
) -> None:
    """Compare two runs metric by metric: values, ratio, p-value, verdict; Markdown for a PR comment."""
    unknown = set(fail_on or []) - set(FAIL_ON)
    if unknown:
        raise RecordsError(f"--fail-on {', '.join(sorted(unknown))}: expected {', '.join(FAIL_ON)}")
    partial = [f"{p} ({h.describe()})" for p in (base_dir, new_dir) if (h := still_written(p, live))]
    base, new = load_run(base_dir), load_run(new_dir)
    for run in (base, new):
        if not run.records:
            raise RecordsError(f"{run.path}: no requests recorded, nothing to compare")
    differences = workload_differences(
        workload_of(base.meta, base.records), workload_of(new.meta, new.records)
    )
    if differences and not force:
        raise RecordsError(
            f"{base_dir} and {new_dir} ran different workloads ({'; '.join(differences)}); "
            "a diff would compare unlike things: pass --force to compare anyway"
        )
    result = diff_runs(
        base.records,
        new.records,
        threshold=threshold,
        alpha=alpha,
        compared=(base.compared, new.compared),
        quality=(quality_settings(base.meta), quality_settings(new.meta)),
    )
    moved = signal_changes(server_blocks(base.path, base.records), server_blocks(new.path, new.records))
    text = render_diff(result, str(base_dir), str(new_dir), moved)
    if partial:
        still = "; ".join(partial)
        text = f"> **{PARTIAL_HEADING}**: {still}, so these are its finished requests only.\n\n{text}"
    if out_file is not None:
        out_file.write_text(text, encoding="utf-8")
    typer.echo(text, nl=False)
    failing = {v for v in (Shift.WORSE, Shift.UNKNOWN) if result.has(v)} | (
        {"findings"} if result.appeared else set()
    )
    if failing & set(fail_on or []):
        raise typer.Exit(1)


def export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder.")],
    fmt: Annotated[ChunkFormat, typer.Option("--format", help="chunks file format.")] = "csv",
    live: LiveOption = False,
) -> None:
    """Write chunks.csv / chunks.parquet (one row per SSE chunk) beside requests.csv, for notebooks."""
    holder = still_written(run_dir, live)
    run = load_run(run_dir)
    target = run.path / PARTIAL_DIR if holder is not None else run.path
    target.mkdir(exist_ok=True)
    path = write_chunks(run.records, target, fmt)
    out.print(f"chunks: {path}  requests: {target / 'requests.csv'}")
