"""One probe: get the build, then for each chosen variant (K0, K3, ...) start its server from that build
through the launcher and run the scenario's workload as trials until the verdict is clear (or max
trials); say good, bad, skip or unknown over all variants.

Trial N of every variant lands in the probe's `trial-N/` run folder (a RunFolder: meta.json as `run`
writes it, requests.jsonl as it streams in, the figures over all its variants), next to one
`server-<variant>.log` per variant. Each variant's pass is the VariantPass every command uses, with the
bisection's capture options."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.figures import Figures, ProbeFigures, trial_figures
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.state import set_aside
from itlaudit.bisect.verdict import Judge, Judgement, ScriptJudge
from itlaudit.capture.runner import CaptureOptions
from itlaudit.errors import BuildUnavailable, LaunchError, ServerRejectedError, ServerUnreachableError
from itlaudit.model.jsonvalue import JSONMapping
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.scenario import Scenario
from itlaudit.model.vocabulary import Verdict
from itlaudit.workflows.run_folder import RunFolder
from itlaudit.workflows.server import VariantServer
from itlaudit.workflows.signals import mark_interrupted

# Called with the server's process group once it is up, so the state file can name it.
OnServer = Callable[[int | None], None]


@dataclass
class ProbeConfig:
    """`specs` holds each chosen variant's server settings (model, args, env) in run order; the
    provider decides which build serves them."""

    scenario: Scenario
    specs: dict[str, LaunchSpec]
    regress: Judge
    threshold: float
    alpha: float
    trials: int
    max_trials: int
    capture: CaptureOptions = field(default_factory=CaptureOptions)  # --workers, --stamp, --api-key, --header
    # The one command that finishes a probe a signal cut, written into its trial folders' mark: the
    # bisection's --resume; `track nightly` run again, for a nightly's probe.
    finish_with: str = "the bisection's --resume, which runs this probe again"

    @property
    def names(self) -> list[str]:
        return list(self.specs)


@dataclass
class ProbeResult:
    verdict: Verdict
    reason: str
    version: str | None = None
    trials: int = 0
    metrics: dict[str, ProbeFigures] = field(default_factory=dict)  # per variant
    detail: JSONMapping = field(default_factory=dict)  # what the judge said, free-form per rule


def _failure(config: ProbeConfig, reason: str) -> ProbeResult:
    """The server would not start or stopped answering: the judge says what that counts as."""
    return ProbeResult(config.regress.failed_server, reason)


def _run_script(judge: ScriptJudge, probe_dir: Path, url: str, build: Build) -> Judgement:
    script = judge.script
    env = {**os.environ, "ITLAUDIT_RUN_DIR": str(probe_dir), "ITLAUDIT_URL": url, "ITLAUDIT_BUILD": build.ref}
    with (probe_dir / "script.log").open("ab") as log:
        code = subprocess.run(
            [*script.split(), str(probe_dir)], stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode
    return Judgement(judge.answer(code), f"script exited {code}", {"script_exit": code})


def run_trial(config: ProbeConfig, server: VariantServer, run_dir: Path) -> dict[str, Figures]:
    """One pass of the workload for the variant `server` serves (the one measure step, with the
    bisection's capture options), added to the trial folder that holds every variant's pass of the
    same number; its figures are derived over all of them, once: each variant's figures come from
    that derivation. No plots or HTML report: they cost seconds per trial and a bisection runs dozens
    (`itlaudit report TRIAL_DIR` draws them whenever one is wanted)."""
    scenario = config.scenario
    folder = RunFolder.begin(run_dir, scenario, context={"bisect": {"trial": run_dir.name}}, extend=True)
    variant_spec = next(v for v in scenario.variants if v.name == server.name)
    try:
        folder.measure(scenario, variant_spec, server, capture=config.capture)
        derivation = folder.finish(scenario.name, [v.name for v in scenario.variants], report=False)
    except KeyboardInterrupt:  # the probe is unfinished, and its trial folder says so
        mark_interrupted(folder, config.finish_with)
        raise
    return trial_figures(derivation.records, derivation.summary)


def _clear(
    config: ProbeConfig, name: str, done: dict[str, list[Figures]], reference: dict[str, Figures] | None
) -> bool:
    """Whether this variant's trials so far settle the verdict. Under `speedup` only the last variant
    decides (its ratio needs every variant); the others run the minimum number of trials."""
    rule = config.regress
    if isinstance(rule, ScriptJudge) or (rule.across_variants and name != config.names[-1]):
        return True
    pooled = {n: Figures.pool(t) for n, t in done.items()}
    names = config.names if rule.across_variants else [name]
    verdict = rule.judge(pooled, reference, names, threshold=config.threshold, alpha=config.alpha)
    return verdict.present is not None


def _run_variant(
    config: ProbeConfig,
    server: VariantServer,
    probe_dir: Path,
    done: dict[str, list[Figures]],
    reference: dict[str, Figures] | None,
) -> None:
    """Trials of one variant until `trials` are done and its verdict is clear, at most `max_trials`."""
    name = server.name
    trials = done.setdefault(name, [])
    while True:
        figures = run_trial(config, server, probe_dir / f"trial-{len(trials) + 1}")
        trials.append(figures[name])
        if len(trials) >= config.max_trials or (
            len(trials) >= config.trials and _clear(config, name, done, reference)
        ):
            return


def run_probe(
    config: ProbeConfig,
    prefetcher: Prefetcher,
    build: Build,
    probe_dir: Path,
    reference: dict[str, Figures] | None,
    on_server: OnServer,
) -> ProbeResult:
    """Every chosen variant in turn, each from its own server started from this build (one server at
    a time: two 35B engines do not share a GPU), then one verdict over all of them."""
    try:
        prepared = prefetcher.get(build)
    except BuildUnavailable as exc:
        return ProbeResult(Verdict.SKIP, str(exc))
    # A folder already there is a probe a signal cut (a bisection's resume set its own aside already;
    # a nightly run again finds it): kept under another name, never appended to.
    set_aside(probe_dir)
    probe_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, list[Figures]] = {}
    scripted: Judgement | None = None
    try:
        for name, base_spec in config.specs.items():
            spec = prefetcher.provider.launch_spec(prepared, base_spec)
            variant = next(v for v in config.scenario.variants if v.name == name)
            with VariantServer.open(variant, probe_dir, spec=spec) as server:
                on_server(server.pid)
                _run_variant(config, server, probe_dir, done, reference)
                if isinstance(config.regress, ScriptJudge) and name == config.names[-1]:
                    scripted = _run_script(config.regress, probe_dir, server.url, build)
    except LaunchError as exc:
        return dataclasses.replace(_failure(config, f"server failed: {exc}"), version=prepared.version)
    except (ServerUnreachableError, ServerRejectedError) as exc:
        return dataclasses.replace(
            _failure(config, f"server stopped answering: {exc}"), version=prepared.version
        )
    pooled = {n: Figures.pool(t) for n, t in done.items()}
    metrics = {n: f.summary() for n, f in pooled.items()}
    trial_count = max(len(t) for t in done.values())
    if scripted is not None:
        label = Verdict.SKIP if scripted.present is None else Verdict.of(scripted.present)
        return ProbeResult(label, scripted.reason, prepared.version, trial_count, metrics, scripted.detail)
    verdict = config.regress.judge(
        pooled, reference, config.names, threshold=config.threshold, alpha=config.alpha
    )
    return ProbeResult(
        Verdict.of(verdict.present), verdict.reason, prepared.version, trial_count, metrics, verdict.detail
    )
