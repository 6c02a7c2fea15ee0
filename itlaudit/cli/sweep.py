"""`itlaudit sweep`: argument checks and the closing lines; the workflow is sweep.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlaudit.analysis.convergence import DEFAULT_CI_WIDTH_PCT, DEFAULT_MAX_TRIALS, trials_settings
from itlaudit.analysis.sweep import parse_points, parse_sla
from itlaudit.capture.runner import CaptureOptions
from itlaudit.cli.options import (
    CiWidthOption,
    CooldownOption,
    FailOnFindingsOption,
    MaxTrialsOption,
    ScenarioArgument,
    TrialsOption,
    capture_options,
    with_options,
    workload_flags,
)
from itlaudit.errors import SweepError
from itlaudit.model.scenario import ScenarioFlags, build_scenario
from itlaudit.model.serve_params import parse_serve_param
from itlaudit.model.vocabulary import LoadAxis

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True)


@with_options("capture", capture_options)
@with_options("flags", workload_flags)
def sweep(
    scenario_path: ScenarioArgument = None,
    concurrency: Annotated[
        str | None, typer.Option(metavar="N,N,...", help="Loads: concurrent streams, e.g. 1,2,4,8.")
    ] = None,
    rate: Annotated[
        str | None, typer.Option(metavar="R,R,...", help="Loads: request rates (requests/s), e.g. 1,2,4.")
    ] = None,
    trials: TrialsOption = "1",
    ci_width: CiWidthOption = DEFAULT_CI_WIDTH_PCT,
    max_trials: MaxTrialsOption = DEFAULT_MAX_TRIALS,
    cooldown: CooldownOption = 0.0,
    sla: Annotated[
        str | None,
        typer.Option(metavar="SLA", help="e.g. 'tpot_p99_ms<=20,ttft_p99_ms<=500': highest load meeting it."),
    ] = None,
    sla_precision: Annotated[
        float | None,
        typer.Option(
            metavar="X", help="Stop bisecting when the bracket is this narrow (default 1 for concurrency)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Sweep folder (default reports/sweep-<scenario>-<time>/)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the sweep in --out, skipping finished points.")
    ] = False,
    serve_param: Annotated[
        list[str] | None,
        typer.Option(
            "--serve-param",
            metavar="NAME=V,V,...",
            help="A server setting to grid, one launched server per value (repeatable; the product of "
            "several), e.g. num_speculative_tokens=0,1,3: the best setting per load. Also [sweep.serve].",
        ),
    ] = None,
    fail_on_findings: FailOnFindingsOption = False,
    *,
    flags: ScenarioFlags,
    capture: CaptureOptions,
) -> None:
    """Run the workload at each load for each variant (one server per variant) and draw where
    speculative decoding stops paying off per token."""
    from itlaudit.workflows.sweep import (  # only to run
        SweepConfig,
        run_sweep,
        selected_variants,
        serve_grid,
        workload_digest,
    )

    if (concurrency is None) == (rate is None):
        raise SweepError("give exactly one of --concurrency 1,2,4,... or --rate 1,2,4,...")
    axis = LoadAxis.CONCURRENCY if concurrency is not None else LoadAxis.RATE
    values = parse_points(concurrency or rate or "", axis)
    try:
        count, convergence = trials_settings(trials, ci_width, max_trials, cooldown)
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    if sla is not None:
        parse_sla(sla)
    precision = (
        sla_precision
        if sla_precision is not None
        else (1.0 if axis == LoadAxis.CONCURRENCY else values[0] / 10)
    )
    if (axis == LoadAxis.CONCURRENCY and precision < 1) or not precision > 0:
        raise SweepError(f"--sla-precision {precision:g}: must be above 0 (at least 1 for concurrency)")
    scenario, _ = build_scenario(scenario_path, flags)
    dataset = scenario.workload.dataset
    if axis == LoadAxis.RATE and dataset is not None and dataset.kind == "multi_turn":
        raise SweepError(
            "--rate cannot pace multi_turn sessions (each turn follows the last one's reply): sweep "
            "--concurrency, the number of sessions at once"
        )
    urls = {v.name: flags.url for v in scenario.variants} if flags.url else flags.variant_urls
    params = {**scenario.serve_params, **dict(parse_serve_param(text) for text in serve_param or [])}
    scenario, names, settings = serve_grid(scenario, selected_variants(scenario, flags.only), params, urls)
    config = SweepConfig(
        scenario=scenario.name,
        axis=axis,
        values=[float(v) for v in values],
        variants=names,
        trials=count,
        convergence=convergence,
        sla=sla,
        sla_precision=precision,
        goodput=dict(scenario.goodput),
        workload=workload_digest(scenario),
        serve=settings,
    )
    sweep_dir, result = run_sweep(
        scenario, config, out=out_dir, resume=resume, variant_urls=urls, console=err, capture=capture
    )
    for sentence in result.headline:
        out.print(sentence, markup=False)
    out.print(f"sweep: {(sweep_dir / 'report.md').resolve()}", markup=False)
    if fail_on_findings and any(point["findings"] for points in result.variants.values() for point in points):
        raise typer.Exit(1)
