"""`itlaudit run`, `compare` and `demo`: parse the workload, the capture and where the run goes, call
the run workflow, print each variant's result block and where the reports are."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer
from rich.console import Console

from itlaudit.analysis.convergence import (
    DEFAULT_CI_WIDTH_PCT,
    DEFAULT_MAX_TRIALS,
    ConvergenceSettings,
    trials_settings,
)
from itlaudit.cli.options import (
    CiWidthOption,
    CooldownOption,
    FailOnFindingsOption,
    MaxTrialsOption,
    PlotsOption,
    ScenarioArgument,
    TrialsOption,
    capture_options,
    with_options,
    workload_flags,
)
from itlaudit.errors import ItlauditError
from itlaudit.model.run_labels import RunLabels, parse_metadata
from itlaudit.model.scenario import Scenario, ScenarioFlags, build_scenario, parse_scenario, scenario_toml
from itlaudit.store.rundir import COMPARE_FILE

if TYPE_CHECKING:  # the run workflow (the capture stack, numpy) loads when a command runs, not for --help
    from itlaudit.analysis.comparison import CompareResult, VariantComparison
    from itlaudit.capture.runner import CaptureOptions
    from itlaudit.workflows.ledger import LedgerPolicy
    from itlaudit.workflows.run import RunOutcome

DEMO_SCENARIO = Path(__file__).resolve().parent.parent / "data" / "demo.toml"
LEDGER = Path("reports") / "ledger.jsonl"
err = Console(stderr=True)
out = Console()


class RunKwargs(TypedDict):
    """What run's and compare's settings hand their workflow, by keyword (run_scenario, run_compare)."""

    url: str | None
    variant_urls: dict[str, str]
    run_dir: Path | None
    console: Console
    ledger: LedgerPolicy
    append: bool
    labels: RunLabels


def _check_output_file(option: str, path: Path, folder_hint: str = "") -> None:
    """A file written after the run (--save-result, the --ledger) refused before the first request, not
    after the whole run, where it cannot be written: a folder, a file this user cannot write, or under
    something that is not a folder this user can write."""
    if path.is_dir():
        raise ItlauditError(f"{option} {path}: a folder; give a file in it{folder_hint}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ItlauditError(f"{option} {path}: a file this user cannot write")
    existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK)):
        raise ItlauditError(f"{option} {path}: {existing} is not a folder this user can write")


@dataclass(frozen=True)
class RunSettings:
    """What `run` and `compare` take the same way besides the workload and the capture: where the run
    goes, the ledger, and the files written beside it."""

    run_dir: Path | None
    ledger: LedgerPolicy
    append: bool
    save_scenario: Path | None
    save_result: Path | None
    labels: RunLabels
    plots: bool
    save_detailed: bool = False  # --save-detailed: the result file's per-request arrays too
    append_result: bool = False  # --append-result: a JSON line added to the file, as vllm bench adds it
    track: str | None = None  # --track DB: record the finished run in that history (itlaudit track)

    def scenario(self, path: Path | None, flags: ScenarioFlags) -> Scenario:
        """The scenario with the flags over it; --save-scenario writes it before anything is sent, and
        the files written after the run (--save-result, the --ledger) are checked then too."""
        if self.save_result is not None:
            _check_output_file(
                "--save-result",
                self.save_result,
                f" (or vllm bench's --save-result --result-dir {self.save_result})",
            )
        _check_output_file("--ledger", self.ledger.path)
        scenario, raw = build_scenario(path, flags)
        if self.save_scenario is not None:
            header = [
                "Written by itlaudit --save-scenario from:",
                f"  {self.labels.command_line}",
                f"Run it again with: itlaudit run {self.save_scenario}",
                "Each commented key is the flag that sets it; a flag given with a scenario replaces its key.",
            ]
            base = path.parent if path is not None else Path.cwd()
            try:
                self.save_scenario.write_text(scenario_toml(raw, base, self.save_scenario, header), "utf-8")
            except OSError as exc:
                raise ItlauditError(f"--save-scenario {self.save_scenario}: {exc.strerror or exc}") from None
            err.print(f"scenario: {self.save_scenario}", markup=False, highlight=False, soft_wrap=True)
        return scenario

    def reporting(self) -> AbstractContextManager[None]:
        """Where the run is captured and derived: its reports drawn, or written without plots."""
        from itlaudit.report.writer import plots_skipped

        return plots_skipped(not self.plots)

    def run_kwargs(self, flags: ScenarioFlags) -> RunKwargs:
        return {
            "url": flags.url,
            "variant_urls": flags.variant_urls,
            "run_dir": self.run_dir,
            "console": err,
            "ledger": self.ledger,
            "append": self.append,
            "labels": self.labels,
        }


def run_settings(
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Run folder (default reports/<scenario>-<time>/)."),
    ] = None,
    ledger: Annotated[
        Path, typer.Option(metavar="FILE", help="Experiment ledger: a repeat of a recorded run is named.")
    ] = LEDGER,
    repeat: Annotated[
        bool,
        typer.Option("--repeat/--no-repeat", help="--no-repeat: refuse a run the ledger already holds."),
    ] = True,
    force: Annotated[
        bool, typer.Option("--force", help="Run even when --no-repeat would refuse it.")
    ] = False,
    append: Annotated[
        bool, typer.Option("--append", help="Add to the existing run folder given as --out.")
    ] = False,
    save_scenario: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Also write the scenario as run (file and flags) as commented TOML."
        ),
    ] = None,
    save_result: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Also write a vllm bench serve style result JSON (its key names)."),
    ] = None,
    save_detailed: Annotated[
        bool,
        typer.Option(
            "--save-detailed",
            help="The result file also holds vllm bench's per-request arrays (ttfts, itls, …).",
        ),
    ] = False,
    append_result: Annotated[
        bool,
        typer.Option(
            "--append-result",
            help="Add the result to the --save-result file as one more JSON line, as vllm bench does.",
        ),
    ] = False,
    label: Annotated[
        str | None, typer.Option(metavar="TEXT", help="A label carried into every result file.")
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="Carried into every result file (repeatable)."),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            metavar="openai|vllm|openai-chat",
            help="vllm bench's --backend: picks the endpoint (openai, vllm: completions; openai-chat: chat) "
            "and is the result file's backend.",
        ),
    ] = None,
    plots: PlotsOption = True,
    track: Annotated[
        str | None,
        typer.Option(metavar="DB", help="Also record the run in a track history (file or postgresql://)."),
    ] = None,
) -> RunSettings:
    """The options `run` and `compare` share, declared once and checked once."""
    if append and out_dir is None:
        raise ItlauditError("--append needs --out: the run folder to add to")
    from itlaudit.workflows.ledger import LedgerPolicy

    return RunSettings(
        run_dir=out_dir,
        ledger=LedgerPolicy(ledger, no_repeat=not repeat and not force),
        append=append,
        save_scenario=save_scenario,
        save_result=save_result,
        save_detailed=save_detailed,
        append_result=append_result,
        plots=plots,
        labels=RunLabels.from_argv(
            ["itlaudit", *sys.argv[1:]], label=label, metadata=parse_metadata(metadata or []), backend=backend
        ),
        track=track,
    )


def _print_outcome(outcome: RunOutcome, comparison: CompareResult | None = None) -> None:
    """Per variant, vllm bench serve's result block with the token ITL beside its chunk ITL
    (report.terminal; compare's adds the Speculative Decoding section from its /metrics window), then
    where both reports are. Lines are never wrapped: a label stays with its value in a CI log or a
    narrow terminal."""
    from itlaudit.report.terminal import result_block
    from itlaudit.report.writer import REPORT_HTML, REPORT_MD

    summary = outcome.derivation.summary
    for name in summary.variants:
        row = comparison.variants.get(name) if comparison is not None else None
        for line, style in result_block(summary, outcome.meta, name, row):
            out.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
    for report in (REPORT_MD, REPORT_HTML):
        where = (outcome.run_dir / report).resolve()
        out.print(f"report: {where}", markup=False, highlight=False, soft_wrap=True)


def _save_result(settings: RunSettings, run_dir: Path) -> None:
    if settings.save_result is None:
        return
    from itlaudit.store.result import save_result

    written = save_result(
        settings.save_result, run_dir, detailed=settings.save_detailed, append=settings.append_result
    )
    for path in written:
        out.print(f"result: {path.resolve()}", markup=False, highlight=False, soft_wrap=True)


def _track(settings: RunSettings, run_dir: Path) -> None:
    """--track DB: the finished folder into the history, as `itlaudit track add` would."""
    if settings.track is None:
        return
    from itlaudit.track.record import record

    written, _, where = record(settings.track, [run_dir])
    out.print(f"track: {written} points recorded in {where}", markup=False, highlight=False, soft_wrap=True)


@with_options("capture", capture_options)
@with_options("flags", workload_flags)
@with_options("settings", run_settings)
def run(
    scenario: ScenarioArgument = None,
    fail_on_findings: FailOnFindingsOption = False,
    trials: TrialsOption = "1",
    ci_width: CiWidthOption = DEFAULT_CI_WIDTH_PCT,
    max_trials: MaxTrialsOption = DEFAULT_MAX_TRIALS,
    cooldown: CooldownOption = 0.0,
    *,
    settings: RunSettings,
    flags: ScenarioFlags,
    capture: CaptureOptions,
) -> None:
    """Stream a workload to each server and audit it: token-true ITL from the server's token counts,
    and truncation findings. The workload is a SCENARIO file, vllm bench serve's flags, or both (a flag
    replaces the key it names)."""
    from itlaudit.workflows.run import run_scenario

    count, convergence = _trials_settings(trials, ci_width, max_trials, cooldown)
    if count > 1 or convergence is not None:
        findings = _run_trials(
            settings.scenario(scenario, flags), settings, flags, capture, count, convergence, run_scenario
        )
        if fail_on_findings and findings:
            raise typer.Exit(1)
        return
    with settings.reporting():
        outcome = run_scenario(
            settings.scenario(scenario, flags), **settings.run_kwargs(flags), capture=capture
        )
    _print_outcome(outcome)
    _save_result(settings, outcome.run_dir)
    _track(settings, outcome.run_dir)
    if fail_on_findings and outcome.finding_count:
        raise typer.Exit(1)


def _trials_settings(
    trials: str, ci_width: float, max_trials: int, cooldown: float
) -> tuple[int, ConvergenceSettings | None]:
    """--trials/--ci-width/--max-trials/--cooldown read once for run and compare; bad ones are one line."""
    try:
        return trials_settings(trials, ci_width, max_trials, cooldown)
    except ValueError as exc:
        raise ItlauditError(str(exc)) from None


def _run_trials(
    scenario: Scenario,
    settings: RunSettings,
    flags: ScenarioFlags,
    capture: CaptureOptions,
    count: int,
    convergence: ConvergenceSettings | None,
    run_once: Callable[..., RunOutcome],
) -> int:
    """--trials N|auto: each trial a run folder under one (--out, else reports/<scenario>-trials-<time>),
    made by `run_once` (run's run_scenario, or compare's pass that returns the outcome first), then per
    variant its interval and why the trials stopped (workflows.trials); the findings of all trials are
    counted."""
    from itlaudit.workflows.trials import TRIALS_FILE, run_trials

    if settings.append or settings.save_result or settings.track:
        raise ItlauditError(
            "--append, --save-result and --track take one run folder; --trials makes one per trial: "
            "run them on a trial's folder (itlaudit track add, itlaudit report)"
        )
    kwargs = settings.run_kwargs(flags)

    def run_one(folder: Path) -> RunOutcome:
        with settings.reporting():
            outcome = run_once(scenario, **{**kwargs, "run_dir": folder}, capture=capture)
        _print_outcome(outcome)
        return outcome

    done = run_trials(scenario, run_one, count=count, convergence=convergence, folder=settings.run_dir)
    for name, progress in done.progress.items():
        interval = progress.interval.text(" ms") if progress.interval is not None else "no interval"
        out.print(
            f"{name}: itl_ms p50 {interval}; {progress.reason}", markup=False, highlight=False, soft_wrap=True
        )
    out.print(
        f"trials: {(done.folder / TRIALS_FILE).resolve()}", markup=False, highlight=False, soft_wrap=True
    )
    return sum(outcome.finding_count for outcome in done.outcomes)


@with_options("capture", capture_options)
@with_options("flags", workload_flags)
@with_options("settings", run_settings)
def compare(
    scenario: ScenarioArgument = None,
    fail_on_findings: FailOnFindingsOption = False,
    distribution_audit: Annotated[
        bool | None,
        typer.Option(
            "--distribution-audit/--no-distribution-audit",
            help="Lossless at temperature > 0: score sampled outputs under the baseline's server and "
            "compare per-token log-likelihoods. Default: for each variant that speculates.",
        ),
    ] = None,
    trials: TrialsOption = "1",
    ci_width: CiWidthOption = DEFAULT_CI_WIDTH_PCT,
    max_trials: MaxTrialsOption = DEFAULT_MAX_TRIALS,
    cooldown: CooldownOption = 0.0,
    *,
    settings: RunSettings,
    flags: ScenarioFlags,
    capture: CaptureOptions,
) -> None:
    """`run` plus each server's /metrics scraped around its variant: spec-decode acceptance from the
    server beside the stream's, output mismatches explained, compare.json. The first variant is the
    baseline (K0)."""
    from itlaudit.analysis.comparison import acceptance_reading
    from itlaudit.workflows.compare import run_compare

    count, convergence = _trials_settings(trials, ci_width, max_trials, cooldown)
    if count > 1 or convergence is not None:

        def compare_once(scenario: Scenario, **kwargs: Any) -> RunOutcome:
            # each trial a whole compare (its compare.json in the trial's folder); the interval is
            # judged on the outcome's summary, as run's trials are
            return run_compare(scenario, **kwargs, distribution=distribution_audit)[0]

        findings = _run_trials(
            settings.scenario(scenario, flags), settings, flags, capture, count, convergence, compare_once
        )
        if fail_on_findings and findings:
            raise typer.Exit(1)
        return
    with settings.reporting():
        outcome, comparison = run_compare(
            settings.scenario(scenario, flags),
            **settings.run_kwargs(flags),
            capture=capture,
            distribution=distribution_audit,
        )
    _print_outcome(outcome, comparison)
    for name, row in comparison.variants.items():
        spec = row.spec_decode
        # analysis.validity: a capped or failing variant's speedup is not printed as one.
        speed = (
            f"not comparable: {row.not_comparable}"
            if row.not_comparable
            else f"token-ITL speedup {_fmt(row.speedup_token_itl, '×')}, decode tok/s speedup "
            f"{_fmt(row.speedup_decode_tokens_per_s, '×')}"
        )
        out.print(
            f"{name}: {speed}, "
            f"acceptance rate {_fmt(spec.acceptance_rate if spec else None)}, "
            f"acceptance length /metrics {_fmt(spec.acceptance_length if spec else None)} "
            "(per drafting step) vs "
            f"stream {_fmt(row.stream_acceptance_length)} (tokens per decode chunk, every step)"
            + (f": {reading}" if (reading := acceptance_reading(row)) else "")
            + _prefix_cache_text(row),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if comparison.quality:
        out.print(f"quality: {comparison.quality}", markup=False, highlight=False, soft_wrap=True)
    _print_distribution(comparison)
    for finding in comparison.findings:
        out.print(
            f"[bold red]{finding['code']}[/bold red]: {finding['message']}", highlight=False, soft_wrap=True
        )
    out.print(f"compare: {(outcome.run_dir / COMPARE_FILE).resolve()}", markup=False, soft_wrap=True)
    _save_result(settings, outcome.run_dir)
    _track(settings, outcome.run_dir)
    if fail_on_findings and outcome.finding_count:  # the comparison findings are counted in it
        raise typer.Exit(1)


def _prefix_cache_text(row: VariantComparison) -> str:
    """The server's prefix-cache hit rate over the variant's window, where its /metrics reports one."""
    block = row.prefix_cache
    if not block or block.get("hit_rate") is None:
        return ""
    tokens = f"{block['hits']:.0f}/{block['queries']:.0f} tokens"
    return f", prefix-cache hit rate {block['hit_rate']:.1%} ({tokens})"


def _print_distribution(comparison: CompareResult) -> None:
    """One line per variant the temperature > 0 distribution audit judged, or why it could not."""
    block = comparison.distribution
    if block is None:
        return
    if "skipped" in block:
        out.print(f"distribution audit skipped: {block['skipped']}", markup=False, soft_wrap=True)
        return
    for name, row in block["variants"].items():
        shift = "–" if row.get("effect_nats") is None else f"{row['effect_nats']:+.3f}"
        p_value = "–" if row.get("p_value") is None else f"{row['p_value']:.2g}"
        out.print(
            f"{name}: log-likelihood under {block['scorer']} {_fmt(row['spec_mean'])} vs "
            f"{_fmt(row['base_mean'])} nats/token (shift {shift}, p {p_value}): {row['verdict']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _fmt(value: float | None, unit: str = "") -> str:
    return "–" if value is None else f"{value:.2f}{unit}"


@with_options("capture", capture_options)
def demo(
    out_dir: Annotated[
        Path | None, typer.Option("--out", metavar="DIR", help="Run folder (default reports/demo-<time>/).")
    ] = None,
    *,
    capture: CaptureOptions,
) -> None:
    """K0 vs K3 vs a 128-token-capped K3, on the built-in simulator: the seed case in ~20 seconds."""
    from itlaudit.workflows.run import run_scenario

    scenario = parse_scenario(DEMO_SCENARIO.read_text(encoding="utf-8"), DEMO_SCENARIO)
    labels = RunLabels.from_argv(["itlaudit", *sys.argv[1:]])
    outcome = run_scenario(scenario, run_dir=out_dir, console=err, capture=capture, labels=labels)
    _print_outcome(outcome)
