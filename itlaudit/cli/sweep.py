"""`itlaudit sweep`: argument checks and the closing lines; the workflow is sweep.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlaudit.analysis.sweep import CONCURRENCY, RATE, parse_goodput, parse_points, parse_sla
from itlaudit.errors import ScenarioError, SweepError
from itlaudit.model.scenario import load_scenario
from itlaudit.workflows.sweep import SweepConfig, run_sweep, selected_variants

__all__ = ["err", "out", "sweep"]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True)


def sweep(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="Scenario TOML file.")],
    concurrency: Annotated[str | None, typer.Option(help="Loads: concurrent streams, e.g. 1,2,4,8.")] = None,
    rate: Annotated[str | None, typer.Option(help="Loads: request rates (requests/s), e.g. 1,2,4.")] = None,
    variant: Annotated[
        list[str] | None, typer.Option(help="NAME (repeat) to sweep only these; NAME=URL: its server's URL.")
    ] = None,
    trials: Annotated[int, typer.Option(help="Runs per point; their spread becomes error bars.")] = 1,
    sla: Annotated[
        str | None, typer.Option(help="e.g. 'tpot_p99_ms<=20,ttft_p99_ms<=500': highest load meeting it.")
    ] = None,
    sla_precision: Annotated[
        float | None,
        typer.Option(help="Stop bisecting when the bracket is this narrow (default 1 for concurrency)."),
    ] = None,
    goodput: Annotated[
        str | None, typer.Option(help="SLOs for goodput, e.g. 'ttft_ms=500,tpot_ms=20,e2e_ms=4000'.")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Sweep folder (default reports/sweep-<name>-<time>/).")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the sweep in --out, skipping finished points.")
    ] = False,
    workers: Annotated[str, typer.Option(help="Capture processes: N, or auto.")] = "auto",
    stamp: Annotated[
        str, typer.Option(help="kernel (socket receive time; loop where unsupported) or loop.")
    ] = "kernel",
    cluster: Annotated[
        str, typer.Option(help="none: capture processes here; ray (or auto), ray://HOST:PORT: Ray actors.")
    ] = "none",
) -> None:
    """Run the workload at each load for each variant (one server per variant) and draw where
    speculative decoding stops paying off per token."""
    if (concurrency is None) == (rate is None):
        raise SweepError("give exactly one of --concurrency 1,2,4,... or --rate 1,2,4,...")
    axis = CONCURRENCY if concurrency is not None else RATE
    values = parse_points(concurrency or rate or "", axis)
    if trials < 1:
        raise SweepError(f"--trials {trials}: must be at least 1")
    if sla is not None:
        parse_sla(sla)
    precision = (
        sla_precision if sla_precision is not None else (1.0 if axis == CONCURRENCY else values[0] / 10)
    )
    if (axis == CONCURRENCY and precision < 1) or not precision > 0:
        raise SweepError(f"--sla-precision {precision:g}: must be above 0 (at least 1 for concurrency)")
    from itlaudit.capture.runner import CaptureOptions

    capture = CaptureOptions.from_flags(workers, stamp, cluster=cluster)
    scenario = load_scenario(scenario_path)
    names, urls = [], {}
    for item in variant or []:
        name, sep, url = item.partition("=")
        if sep and not url.startswith(("http://", "https://")):
            raise ScenarioError(f"--variant {item!r}: expected NAME or NAME=http://HOST:PORT")
        names.append(name)
        if sep:
            urls[name] = url.rstrip("/")
    slo = parse_goodput(goodput) if goodput else scenario.goodput
    config = SweepConfig(
        scenario=scenario.name,
        axis=axis,
        values=[float(v) for v in values],
        variants=selected_variants(scenario, names),
        trials=trials,
        sla=sla,
        sla_precision=precision,
        goodput=dict(slo),
    )
    sweep_dir, result = run_sweep(
        scenario, config, out=out_dir, resume=resume, variant_urls=urls, console=err, capture=capture
    )
    for sentence in result["headline"]:
        out.print(sentence, markup=False)
    out.print(f"sweep: {sweep_dir / 'report.md'}", markup=False)
