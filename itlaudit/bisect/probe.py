"""One probe: get the build, start its server through the launcher, run the scenario's workload as
trials until the verdict is clear (or max trials), and say good, bad, skip or unknown.

Each trial is an itlaudit run folder under the probe's folder, next to the server log: requests.jsonl
as it streams in and summary.json, the figures the verdict reads. Not the plots and HTML report of
`itlaudit run`: they cost seconds per trial and a bisection runs dozens; `itlaudit report TRIAL_DIR`
derives them from requests.jsonl whenever one is wanted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.errors import BuildUnavailable
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.verdict import Judgement, Regress, Trial, judge, metrics, read_trial, script_answer
from itlaudit.errors import LaunchError, ServerRejectedError, ServerUnreachableError
from itlaudit.launcher import LaunchSpec, launch
from itlaudit.records import RecordWriter
from itlaudit.rundir import REQUESTS_FILE, SUMMARY_FILE, write_json
from itlaudit.runner import run_variant
from itlaudit.scenario import Scenario
from itlaudit.summary import run_summary

GOOD, BAD, SKIP, UNKNOWN = "good", "bad", "skip", "unknown"
SERVER_LOG = "server.log"

# Called with the server's process group once it is up, so the state file can name it.
OnServer = Callable[[int | None], None]


@dataclass
class ProbeConfig:
    scenario: Scenario
    base_spec: LaunchSpec
    regress: Regress
    threshold: float
    alpha: float
    trials: int
    max_trials: int


@dataclass
class ProbeResult:
    verdict: str
    reason: str
    version: str | None = None
    trials: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


def _verdict(present: bool | None) -> str:
    return UNKNOWN if present is None else BAD if present else GOOD


def _failure(config: ProbeConfig, reason: str) -> ProbeResult:
    """The server would not start or stopped answering: that is the regression only under `error`."""
    return ProbeResult(BAD if config.regress.mode == "error" else UNKNOWN, reason)


def _run_script(config: ProbeConfig, probe_dir: Path, url: str, build: Build) -> Judgement:
    script = config.regress.script or ""
    env = {**os.environ, "ITLAUDIT_RUN_DIR": str(probe_dir), "ITLAUDIT_URL": url, "ITLAUDIT_BUILD": build.ref}
    with (probe_dir / "script.log").open("ab") as log:
        code = subprocess.run(
            [*script.split(), str(probe_dir)], stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode
    return Judgement(script_answer(code, script), f"script exited {code}", {"script_exit": code})


def run_trial(scenario: Scenario, url: str, run_dir: Path) -> Path:
    variant = scenario.variants[0].name
    run_dir.mkdir(parents=True, exist_ok=True)
    with RecordWriter(run_dir / REQUESTS_FILE) as writer:
        records = asyncio.run(run_variant(scenario, variant, url, writer))
    write_json(run_dir / SUMMARY_FILE, run_summary(records, [variant]))
    return run_dir


def run_trials(
    config: ProbeConfig, probe_dir: Path, url: str, baseline: list[float] | None, build: Build
) -> tuple[list[Trial], Judgement]:
    """Trials until `trials` are done and the verdict is clear, at most `max_trials`."""
    done: list[Trial] = []
    while True:
        trial_dir = run_trial(config.scenario, url, probe_dir / f"trial-{len(done) + 1}")
        done.append(read_trial(trial_dir))
        if config.regress.mode == "script":
            if len(done) >= config.trials:
                return done, _run_script(config, probe_dir, url, build)
            continue
        verdict = judge(config.regress, done, baseline, threshold=config.threshold, alpha=config.alpha)
        if len(done) >= config.max_trials or (len(done) >= config.trials and verdict.present is not None):
            return done, verdict


def run_probe(
    config: ProbeConfig,
    prefetcher: Prefetcher,
    build: Build,
    probe_dir: Path,
    baseline: list[float] | None,
    on_server: OnServer,
) -> ProbeResult:
    try:
        prepared = prefetcher.get(build)
    except BuildUnavailable as exc:
        return ProbeResult(SKIP, str(exc))
    spec = prefetcher.provider.launch_spec(prepared, config.base_spec)
    probe_dir.mkdir(parents=True, exist_ok=True)
    try:
        with launch(spec, probe_dir / SERVER_LOG) as server:
            on_server(server.pid)
            trials, verdict = run_trials(config, probe_dir, server.url, baseline, build)
    except LaunchError as exc:
        return dataclasses.replace(_failure(config, f"server failed: {exc}"), version=prepared.version)
    except (ServerUnreachableError, ServerRejectedError) as exc:
        return dataclasses.replace(
            _failure(config, f"server stopped answering: {exc}"), version=prepared.version
        )
    label = SKIP if config.regress.mode == "script" and verdict.present is None else _verdict(verdict.present)
    return ProbeResult(label, verdict.reason, prepared.version, len(trials), metrics(trials), verdict.detail)
