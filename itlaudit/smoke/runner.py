"""Composes a smoke: one server at a time, every scenario that uses it, then the checks.

Servers run one at a time because on a DGX Spark two 35B engines do not fit next to each other in
unified memory; each server is started once for all its scenarios because a start costs more than
the whole suite. Each (scenario, server) pair is an ordinary `compare` run in its own folder, so
everything a smoke measured can be re-read with the usual tools.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
from rich.console import Console

from itlaudit.capture.runner import CaptureOptions
from itlaudit.errors import RecordsError, RunInterrupted, SuiteError
from itlaudit.model.access import NO_ACCESS
from itlaudit.model.codes import Finding
from itlaudit.model.meta import EnvironmentRecord, HostEnvironment
from itlaudit.model.scenario import Variant
from itlaudit.report.progress import Reporter
from itlaudit.serve.environment import host_environment
from itlaudit.smoke.checks import CheckResult, Results, evaluate, exit_code, variant_figures
from itlaudit.smoke.junit import write_junit
from itlaudit.smoke.output import render_markdown
from itlaudit.smoke.suite import Suite, server_launch
from itlaudit.store.rundir import DEFAULT_REPORTS, new_run_dir, read_versioned, write_versioned
from itlaudit.workflows.compare import run_compare
from itlaudit.workflows.server import VariantServer

SMOKE_FILE = "smoke.json"
REPORT_FILE = "report.md"
JUNIT_FILE = "junit.xml"


class SmokeEnvironment(msgspec.Struct, frozen=True, kw_only=True):
    """The host (serve.environment) and each server's record (capture.server_info), as written."""

    host: HostEnvironment
    servers: dict[str, EnvironmentRecord]


class SmokeReport(msgspec.Struct, frozen=True, kw_only=True):
    """smoke.json (without `format`, which the writer stamps), field order the file's."""

    suite: str
    suite_path: str
    verdict: str
    runtime_s: float
    baseline: str | None
    checks: list[CheckResult]
    environment: SmokeEnvironment
    results: Results


@dataclass
class SmokeOutcome:
    out_dir: Path
    smoke: SmokeReport
    results: list[CheckResult]

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)


def load_baseline(path: Path) -> Results:
    """A previous smoke.json's figures; only its `results` are compared against."""
    try:
        data = read_versioned(path)
    except (OSError, ValueError) as exc:
        raise RecordsError(f"--baseline {path}: cannot read a smoke.json ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise RecordsError(
            f"--baseline {path}: not a smoke.json (no `results`); pass a previous smoke's file"
        )
    try:
        return msgspec.convert(data["results"], Results)
    except msgspec.ValidationError as exc:
        raise RecordsError(
            f"--baseline {path}: its `results` are not a smoke's figures ({exc}); "
            "pass a previous smoke's file"
        ) from None


def _check_servers(suite: Suite, urls: dict[str, str], launch: str | None, model: str | None) -> None:
    unknown = set(urls) - {s.name for s in suite.servers} - {"*"}
    if unknown:
        names = ", ".join(s.name for s in suite.servers)
        raise SuiteError(f"--variant names {', '.join(sorted(unknown))}, not a server of the suite ({names})")
    for server in suite.servers:
        if (
            server.name not in urls
            and "*" not in urls
            and server_launch(suite, server, launch, model) is None
        ):
            raise SuiteError(
                f"server {server.name} has no URL and {suite.path} has no [launch]; pass "
                f"--variant {server.name}=URL (or --url URL) or --launch python:PATH|docker:IMAGE|command:CMD"
            )


def run_smoke(
    suite: Suite,
    *,
    urls: dict[str, str] | None = None,
    launch: str | None = None,
    model: str | None = None,
    baseline: Path | None = None,
    out_dir: Path | None = None,
    junit: Path | None = None,
    console: Console | None = None,
    capture: CaptureOptions | None = None,
) -> SmokeOutcome:
    """Run the suite; `urls` maps server names (or "*" for all) to running servers; `capture` is how
    requests are sent (--api-key, --header, --workers, --stamp: run's options of the same names)."""
    urls = urls or {}
    _check_servers(suite, urls, launch, model)
    baseline_results = load_baseline(baseline) if baseline is not None else None
    out_dir = out_dir or new_run_dir(DEFAULT_REPORTS, f"smoke-{suite.name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: Results = {s.name: {} for s in suite.scenarios}
    reporter = Reporter(console)
    servers = {server.name for server in suite.servers}
    total = sum(1 for scenario in suite.scenarios for v in scenario.variants if v.name in servers)
    servers_env: dict[str, EnvironmentRecord] = {}
    for server in suite.servers:
        users = [s for s in suite.scenarios if any(v.name == server.name for v in s.variants)]
        if not users:
            continue
        config = server_launch(suite, server, launch, model)
        override = urls.get(server.name) or urls.get("*")
        fingerprints: list[str | None] = []
        version: str | None = None
        access = capture.access if capture is not None else NO_ACCESS
        variant = Variant(name=server.name, launch=config)
        with VariantServer.open(variant, out_dir, url=override, access=access, reporter=reporter) as running:
            base_url = running.url
            for scenario in users:
                single = replace(scenario, variants=[v for v in scenario.variants if v.name == server.name])
                rel = Path("runs") / f"{scenario.name}-{server.name}"
                done = sum(len(variants) for variants in results.values())
                reporter.phase(f"smoke run {done + 1} of {total}: {scenario.name} on {server.name}")
                try:
                    outcome, comparison = run_compare(
                        single,
                        variant_urls={server.name: base_url},
                        run_dir=out_dir / rel,
                        console=console,
                        capture=capture,
                    )
                except RunInterrupted as exc:
                    raise RunInterrupted(
                        exc.signal_name,
                        exc.exit_code,
                        f"{exc}; the smoke stopped after {done} of {total} runs (in {out_dir / 'runs'}): "
                        "no verdict",
                    ) from None
                summary = outcome.derivation.summary
                results[scenario.name][server.name] = variant_figures(
                    str(rel),
                    outcome.records,
                    summary.variants[server.name],
                    comparison.variants.get(server.name),
                    # compare.json's findings are among the summary's run findings (one set everywhere)
                    [Finding.from_json(f) for f in summary.run_findings],
                    scenario.workload.params.max_tokens,
                    summary.server.get(server.name),
                )
                fingerprints += [r.system_fingerprint for r in outcome.records]
                # what the pass read from /version after its window: the smoke asks the server nothing more
                passed = outcome.passes.get(server.name)
                version = (passed.version if passed is not None else None) or version
            servers_env[server.name] = running.environment(version, fingerprints)
    reporter.phase("smoke: checking the figures and writing smoke.json, report.md and the JUnit XML")
    checks = evaluate(suite, results, baseline_results)
    runtime = time.monotonic() - started
    verdict = "no-go" if exit_code(checks) else "go"
    smoke = SmokeReport(
        suite=suite.name,
        suite_path=str(suite.path),
        verdict=verdict,
        runtime_s=runtime,
        baseline=str(baseline) if baseline else None,
        checks=checks,
        environment=SmokeEnvironment(host=host_environment(), servers=servers_env),
        results=results,
    )
    write_versioned(out_dir / SMOKE_FILE, msgspec.to_builtins(smoke))
    (out_dir / REPORT_FILE).write_text(render_markdown(smoke, checks), encoding="utf-8")
    properties = {"verdict": verdict, "suite_path": str(suite.path)}
    for name, env in servers_env.items():
        properties[f"{name}.vllm_version"] = str(env.get("vllm_version"))
        properties[f"{name}.system_fingerprint"] = str(env.get("system_fingerprint"))
    for target in {out_dir / JUNIT_FILE, *([junit] if junit else [])}:
        write_junit(target, suite.name, checks, properties, runtime)
    return SmokeOutcome(out_dir=out_dir, smoke=smoke, results=checks)
