"""`itlaudit sweep`: one scenario's workload at a series of loads, each variant's server launched
once for all of them; every (variant, load, trial) is a normal run folder, so `itlaudit report`
works on it, and a folder is finished when its `point.json` exists — which is what `--resume` reads.

Layout: <sweep>/sweep-config.json (what was asked; --resume must ask the same), <sweep>/<variant>/
c<load>-t<trial>/ (run folders), <sweep>/server-<variant>.log, then sweep.json, the PNGs and
report.md/html, rebuilt from the run folders after every variant.

point.json appears whole or not at all (written aside, then renamed), so a signal or SIGKILL at any
moment leaves each trial either finished or not; a trial folder without a readable point.json is kept
aside under a new name and the trial runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from itlaudit.analysis.convergence import ConvergenceRule, ConvergenceSettings
from itlaudit.analysis.summary import RunSummary, VariantSummary
from itlaudit.analysis.sweep import (
    SweepPoint,
    SweepResult,
    TrialFigures,
    parse_sla,
    pool_trials,
    request_figures,
    sla_search,
    sweep_result,
    trial_figures,
)
from itlaudit.capture.cluster import lost_worker_warnings
from itlaudit.capture.described import CaptureDescription
from itlaudit.capture.runner import CaptureOptions, variant_access
from itlaudit.errors import RunInterrupted, ScenarioError, SweepError
from itlaudit.model.formats import FORMAT_KEY
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.scenario import Scenario, Variant
from itlaudit.model.serve_params import ServeValue, expand
from itlaudit.model.stop import check, interruption, wait_or_stop
from itlaudit.model.vocabulary import LoadAxis
from itlaudit.report.progress import Reporter, duration
from itlaudit.store.jsonl import iter_jsonl, load_records
from itlaudit.store.rundir import (
    DEFAULT_REPORTS,
    DERIVED_FILE,
    REQUESTS_FILE,
    new_run_dir,
    read_versioned,
    write_versioned,
)
from itlaudit.workflows.run_folder import RunFolder
from itlaudit.workflows.server import VariantServer
from itlaudit.workflows.signals import mark_interrupted

CONFIG_FILE = "sweep-config.json"
SWEEP_FILE = "sweep.json"
POINT_FILE = "point.json"  # written last in a trial's run folder: the trial is finished


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep measures. Stored in the sweep folder: a resumed sweep must ask the same, or its
    points would mix two experiments."""

    scenario: str
    axis: LoadAxis
    values: list[float]
    variants: list[str]
    trials: int = 1
    sla: str | None = None
    sla_precision: float = 1.0
    goodput: dict[str, float] = field(default_factory=dict)
    # --trials auto: ConvergenceRule's fields, the metric and cooldown_s; `trials` is then the most.
    convergence: ConvergenceSettings | None = None
    # The workload's digest (workload_digest): an edited scenario under the same name is another
    # experiment, which --resume refuses. A sweep folder from before it has none and is not checked.
    workload: str | None = None
    # --serve-param / [sweep.serve]: each swept variant's server setting (model.serve_params.expand);
    # None for a sweep of the scenario's servers as they are.
    serve: dict[str, dict[str, ServeValue]] | None = None

    def to_json(self) -> JSONObject:
        data = dataclasses.asdict(self)
        for key in ("convergence", "serve"):
            if data[key] is None:
                del data[key]  # a config without them reads as it did before they existed
        return data

    def rule(self) -> ConvergenceRule | None:
        if self.convergence is None:
            return None
        found = self.convergence
        return ConvergenceRule(
            ci_width_pct=found["ci_width_pct"], min_trials=found["min_trials"], max_trials=found["max_trials"]
        )


def workload_digest(scenario: Scenario) -> str:
    """What the scenario sends, every prompt, length and sampling parameter, as a short digest."""
    text = json.dumps(
        {
            "endpoint": scenario.endpoint,
            "model": scenario.model,
            "workload": dataclasses.asdict(scenario.workload),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def point_scenario(scenario: Scenario, axis: LoadAxis, value: float, variant: str) -> Scenario:
    """The scenario as one point runs it: one variant, the load set. At a concurrency above the
    scenario's num_requests the point sends `concurrency` requests, so the load is actually reached."""
    workload = scenario.workload
    if axis == LoadAxis.CONCURRENCY:
        load = int(value)
        workload = dataclasses.replace(
            workload, concurrency=load, num_requests=max(workload.num_requests, load)
        )
    else:
        # Open loop at this rate: the schedule, not a cap, sets the load (a closed-loop scenario's
        # concurrency of 1 would otherwise hold every point to one request at a time).
        # (a trace's own schedule gives way too: each point is the rate it names)
        arrivals = dataclasses.replace(workload.arrivals, request_rate=value, ramp_up=None, trace_s=None)
        workload = dataclasses.replace(
            workload, arrivals=arrivals, concurrency=workload.num_requests + arrivals.warmup_requests
        )
    return dataclasses.replace(
        scenario, workload=workload, variants=[v for v in scenario.variants if v.name == variant]
    )


def _label(axis: LoadAxis, value: float) -> str:
    return f"c{int(value)}" if axis == LoadAxis.CONCURRENCY else f"r{value:g}"


def trial_dir(sweep_dir: Path, variant: str, axis: LoadAxis, value: float, trial: int) -> Path:
    return sweep_dir / variant / f"{_label(axis, value)}-t{trial}"


def _finished_load(folder: Path) -> float | None:
    """The load a trial folder finished at, or None when it has not finished: no point.json, or one
    that does not read (cut short by hand or by a disk error: the trial runs again)."""
    try:
        return float(read_versioned(folder / POINT_FILE)["load"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _finished_trials(sweep_dir: Path, variant: str) -> Iterator[tuple[float, Path]]:
    folder = sweep_dir / variant
    if not folder.is_dir():
        return
    for point in sorted(folder.glob(f"*/{POINT_FILE}")):
        if (load := _finished_load(point.parent)) is not None:
            yield load, point.parent


def _base_blocks(sweep_dir: Path, config: SweepConfig, variant: str) -> dict[float, VariantSummary]:
    """The baseline variant's summary block at each load it finished (its first trial there), which a
    later variant's quality is judged against (analysis.validity); none for the baseline itself."""
    base = config.variants[0] if config.variants else variant
    if base == variant:
        return {}
    blocks: dict[float, VariantSummary] = {}
    for load, folder in _finished_trials(sweep_dir, base):
        block = RunFolder.open(folder).summary.variants.get(base)
        if block is not None:
            blocks.setdefault(load, block)
    return blocks


def variant_points(sweep_dir: Path, config: SweepConfig, variant: str) -> dict[float, SweepPoint]:
    """Every finished load of a variant (grid and SLA probes), pooled over its trials; each trial's
    validity judged against the baseline's block at the same load."""
    trials: dict[float, list[TrialFigures]] = {}
    bases = _base_blocks(sweep_dir, config, variant)
    for load, folder in _finished_trials(sweep_dir, variant):
        records = load_records(folder / REQUESTS_FILE)
        derived = {line["request_id"]: line for line in iter_jsonl(folder / DERIVED_FILE)}
        summary = RunFolder.open(folder).summary
        block = summary.variants.get(variant)
        if block is None:
            continue
        requests = [request_figures(r, derived.get(r.request_id, {})) for r in records]
        figures = trial_figures(
            block, records, requests, config.goodput, base=bases.get(load), gate=summary.quality_gate
        )
        trials.setdefault(load, []).append(figures)
    points = {load: pool_trials(config.axis, load, found) for load, found in sorted(trials.items())}
    for load, point in points.items():
        stopped = _convergence_file(sweep_dir, variant, config.axis, load)
        if stopped.is_file():  # --trials auto: why the point stopped, and its interval
            point["convergence"] = read_versioned(stopped)  # PointConvergence: its writer is above
    return points


def _convergence_file(sweep_dir: Path, variant: str, axis: LoadAxis, value: float) -> Path:
    return sweep_dir / variant / f"{_label(axis, value)}-convergence.json"


def _trial_figure(summary: RunSummary, variant: str, metric: str) -> float:
    """A finished trial's p50 of `metric` (nan where it has none: every request failed)."""
    block = summary.variants.get(variant)
    value = (block.distributions.get(metric) or {}).get("p50") if block is not None else None
    return float(value) if isinstance(value, int | float) else math.nan


def open_sweep_dir(out: Path | None, scenario_name: str, config: SweepConfig, resume: bool) -> Path:
    """A new sweep folder, or with --resume the folder of the same sweep (same config)."""
    if resume:
        if out is None or not (out / CONFIG_FILE).is_file():
            raise SweepError(f"--resume needs --out naming a sweep folder (one with {CONFIG_FILE})")
        try:
            stored = read_versioned(out / CONFIG_FILE)
            stored.pop(FORMAT_KEY, None)
        except (OSError, ValueError) as exc:
            raise SweepError(
                f"--resume {out}: {CONFIG_FILE} does not read ({exc}); it is not a sweep this itlaudit "
                "wrote: start a new --out"
            ) from None
        asked = config.to_json()
        if "workload" not in stored:
            asked.pop("workload")  # a sweep begun before the digest was kept: not checked
        if stored != asked:
            differs = sorted(k for k, v in asked.items() if stored.get(k) != v)
            raise SweepError(
                f"--resume {out}: this sweep was started with other {', '.join(differs)}; repeat its "
                f"options (see {out / CONFIG_FILE}) or start a new --out"
            )
        return out
    try:
        if out is None:
            out = new_run_dir(DEFAULT_REPORTS, f"sweep-{scenario_name}")
        elif (out / CONFIG_FILE).exists():
            raise SweepError(
                f"--out {out} already holds a sweep; pass --resume to continue it, or choose a new folder"
            )
        out.mkdir(parents=True, exist_ok=True)
        write_versioned(out / CONFIG_FILE, config.to_json())
    except OSError as exc:
        raise SweepError(
            f"cannot write the sweep folder {out}: {exc.strerror or exc}; choose another --out"
        ) from None
    return out


@dataclass
class _Trial:
    scenario: Scenario
    variant: str
    load: float
    trial: int
    folder: Path


class _Sweeper:
    """Runs the trials of one sweep, each with its progress as it goes (a bar, or plain lines in a log)
    and a line when it is done."""

    def __init__(
        self,
        scenario: Scenario,
        config: SweepConfig,
        sweep_dir: Path,
        console: Console | None,
        capture: CaptureOptions | None,
    ) -> None:
        self.scenario = scenario
        self.config = config
        self.sweep_dir = sweep_dir
        self.capture = capture
        self.reporter = Reporter(console)

    def pending(self, variant: str) -> bool:
        if self.config.rule() is not None:
            grid_left = any(
                not _convergence_file(self.sweep_dir, variant, self.config.axis, v).is_file()
                for v in self.config.values
            )
            return grid_left or self._sla_probe(variant) is not None
        grid_left = any(
            _finished_load(trial_dir(self.sweep_dir, variant, self.config.axis, v, t)) is None
            for v in self.config.values
            for t in range(1, self.config.trials + 1)
        )
        return grid_left or self._sla_probe(variant) is not None

    def _sla_probe(self, variant: str) -> float | None:
        if not self.config.sla:
            return None
        points = variant_points(self.sweep_dir, self.config, variant)
        return sla_search(
            points, self.config.values, parse_sla(self.config.sla), self.config.sla_precision
        ).probe

    def run_variant_loads(self, variant: Variant, server: VariantServer) -> None:
        """Every load and trial of the variant on its server, started once for all of them."""
        for value in self.config.values:
            self._run_load(variant.name, value, server)
        while (probe := self._sla_probe(variant.name)) is not None:
            self._run_load(variant.name, probe, server)

    def _run_load(self, variant: str, value: float, server: VariantServer) -> None:
        """The load's trials: all of them, or with --trials auto until the interval of the metric's
        mean over them is narrow enough (analysis.convergence), a cooldown apart."""
        scenario = point_scenario(self.scenario, self.config.axis, value, variant)
        rule, auto = self.config.rule(), self.config.convergence
        figures: list[float] = []
        for number in range(1, self.config.trials + 1):
            check()  # a signal between two trials: the next one never starts
            folder = trial_dir(self.sweep_dir, variant, self.config.axis, value, number)
            ran: RunSummary | None = None
            if _finished_load(folder) is None:
                if figures and auto and auto.get("cooldown_s"):
                    wait_or_stop(auto["cooldown_s"])
                ran = self._run_trial(_Trial(scenario, variant, value, number, folder), server)
            if rule is None or auto is None:
                continue
            # the trial just run hands its summary over; one a resumed sweep finished earlier is read
            summary = ran if ran is not None else RunFolder.open(folder).summary
            figures.append(_trial_figure(summary, variant, auto["metric"]))
            progress = rule.judge(figures)
            if progress.done:
                write_versioned(
                    _convergence_file(self.sweep_dir, variant, self.config.axis, value),
                    {"metric": f"{auto['metric']} p50", **progress.to_json()},
                )
                interval = progress.interval.text(" ms") if progress.interval is not None else "no interval"
                where = f"{variant} {_label(self.config.axis, value)}"
                self.reporter.phase(f"{where}: {auto['metric']} p50 {interval}; {progress.reason}")
                return

    def _run_trial(self, trial: _Trial, server: VariantServer) -> RunSummary:
        """A run folder like `itlaudit run` makes, and its summary; a folder left by a crash is kept
        aside, never reused or deleted, and the trial runs again in a clean one."""
        if trial.folder.exists():
            n = int(time.time())
            while (aside := trial.folder.with_name(f"{trial.folder.name}.incomplete-{n}")).exists():
                n += 1  # set aside twice within a second
            trial.folder.rename(aside)
        axis = self.config.axis
        folder = RunFolder.begin(
            trial.folder,
            trial.scenario,
            context={"sweep": {"folder": str(self.sweep_dir), axis: trial.load, "trial": trial.trial}},
        )
        variant = next(v for v in trial.scenario.variants if v.name == trial.variant)
        load = f"{axis} {int(trial.load)}" if axis == LoadAxis.CONCURRENCY else f"rate {trial.load:g}/s"
        trials = f" trial {trial.trial}/{self.config.trials}" if self.config.trials > 1 else ""
        workload = trial.scenario.workload
        name = f"{trial.variant} {load}{trials}"
        started = time.monotonic()
        total = workload.num_requests + workload.arrivals.warmup_requests  # every record counts
        self.reporter.phase(f"{name}: {total} requests to {server.url}")

        def on_capture(workers: CaptureDescription) -> None:
            for warning in lost_worker_warnings(workers):
                self.reporter.phase(warning)

        writer = folder.records()
        try:
            with self.reporter.capture(name, total) as counts, writer:
                writer.counts = counts
                folder.measure(
                    trial.scenario,
                    variant,
                    server,
                    writer=writer,
                    capture=self.capture,
                    on_done=counts.landed,
                    on_capture=on_capture,
                )
            with self.reporter.step(f"{name}: deriving its figures"):
                summary = folder.finish(self.scenario.name, [trial.variant]).summary
        except KeyboardInterrupt:  # unfinished (no point.json), and said so (the signal campaign's find)
            mark_interrupted(folder, "the sweep's --resume, which runs this trial again")
            raise
        self.reporter.phase(f"{name}: done in {duration(time.monotonic() - started)} ({trial.folder})")
        point = trial.folder / f"{POINT_FILE}.tmp"
        write_versioned(point, {"load": trial.load, "axis": axis, "trial": trial.trial})
        os.replace(point, trial.folder / POINT_FILE)
        return summary


def run_sweep(
    scenario: Scenario,
    config: SweepConfig,
    *,
    out: Path | None = None,
    resume: bool = False,
    variant_urls: dict[str, str] | None = None,
    console: Console | None = None,
    capture: CaptureOptions | None = None,
) -> tuple[Path, SweepResult]:
    """Each variant in turn: its server started once (or its URL used), every load and trial run,
    then the SLA probes; sweep.json, plots and report rebuilt after each variant and on interrupt."""
    variant_urls = variant_urls or {}
    names = {v.name for v in scenario.variants}
    unknown = [n for n in [*config.variants, *variant_urls] if n not in names]
    if unknown:
        raise ScenarioError(f"variant {unknown[0]!r} is not in the scenario ({', '.join(sorted(names))})")
    sweep_dir = open_sweep_dir(out, scenario.folder_name, config, resume)
    sweeper = _Sweeper(scenario, config, sweep_dir, console, capture)
    chosen = [v for v in scenario.variants if v.name in config.variants]
    reporter = sweeper.reporter
    sweep: SweepResult | None = None  # rebuilt after each variant; a resume may have none left
    try:
        for variant in chosen:
            if not sweeper.pending(variant.name):
                continue
            override = variant_urls.get(variant.name)
            access = variant_access(scenario, variant.name, capture)  # its readiness poll sends the key too
            with VariantServer.open(
                variant, sweep_dir, url=override, access=access, reporter=reporter
            ) as server:
                sweeper.run_variant_loads(variant, server)
            with reporter.step("writing sweep.json, plots and report"):
                sweep = write_sweep_outputs(sweep_dir, scenario.name, config)
    except KeyboardInterrupt:
        signal_name, exit_code = interruption()
        with reporter.step(f"interrupted by {signal_name}: writing sweep.json and report (no plots)"):
            write_sweep_outputs(sweep_dir, scenario.name, config)
        raise RunInterrupted(
            signal_name,
            exit_code,
            f"interrupted by {signal_name}: finished points kept in {sweep_dir} (plots not drawn); "
            "continue with the same command and --resume",
        ) from None
    if sweep is None:
        with reporter.step("writing sweep.json, plots and report"):
            sweep = write_sweep_outputs(sweep_dir, scenario.name, config)
    return sweep_dir, sweep


def build_sweep(sweep_dir: Path, scenario_name: str, config: SweepConfig) -> SweepResult:
    """sweep.json's content, from the finished run folders."""
    series = {name: list(variant_points(sweep_dir, config, name).values()) for name in config.variants}
    return sweep_result(
        scenario_name,
        config.axis,
        config.values,
        config.trials,
        series,
        goodput=config.goodput,
        sla=config.sla,
        sla_precision=config.sla_precision,
        settings=config.serve,
    )


def write_sweep_outputs(sweep_dir: Path, scenario_name: str, config: SweepConfig) -> SweepResult:
    from itlaudit.report.sweep_report import write_sweep_report

    sweep = build_sweep(sweep_dir, scenario_name, config)
    write_versioned(sweep_dir / SWEEP_FILE, sweep.to_json())
    write_sweep_report(sweep_dir, sweep)
    return sweep


def serve_grid(
    scenario: Scenario,
    names: list[str],
    params: Mapping[str, Sequence[ServeValue]],
    urls: Mapping[str, str],
) -> tuple[Scenario, list[str], dict[str, dict[str, ServeValue]] | None]:
    """The scenario, variants and settings a sweep runs: with server parameters to grid, one launched
    variant per setting (model.serve_params.expand), else the chosen variants as they are."""
    if not params:
        return scenario, names, None
    if urls:
        raise SweepError(
            "--serve-param starts a server per setting: drop --url/--variant and let the scenario's "
            "[variants.launch] start them"
        )
    expanded, settings = expand(scenario, names, params)
    return expanded, list(settings), settings


def selected_variants(scenario: Scenario, names: Sequence[str]) -> list[str]:
    """--only NAME (repeatable) picks and orders; none: every variant, scenario order."""
    if not names:
        return [v.name for v in scenario.variants]
    known = [v.name for v in scenario.variants]
    for name in names:
        if name not in known:
            raise ScenarioError(f"--only {name!r} is not in the scenario ({', '.join(known)})")
    return list(dict.fromkeys(names))
