"""Composes a run: for each variant, find or start its server, stream the workload, land records,
then derive the run's files. Shared by `run` and `compare`; it holds no figures of its own."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from itlaudit import __version__
from itlaudit.environment import host_environment, server_environment
from itlaudit.errors import ScenarioError
from itlaudit.records import RecordWriter, RequestRecord
from itlaudit.rundir import META_FILE, REQUESTS_FILE, new_run_dir, write_derived, write_json
from itlaudit.runner import CaptureOptions, resolve_model, run_variant
from itlaudit.scenario import LaunchConfig, Scenario, Variant

if TYPE_CHECKING:
    from itlaudit.launcher import LaunchSpec

DEFAULT_REPORTS = Path("reports")
RUN_DIR_ENV = "ITLAUDIT_RUN_DIR"

# Called around each variant with its base URL: `compare` uses it to scrape /metrics before/after.
VariantHook = Callable[[str, str], Any]


@dataclass(frozen=True)
class LedgerPolicy:
    """The experiment ledger as `run`/`compare` use it: refuse repeats unless forced."""

    path: Path
    force: bool = False

    def check(self, scenario: Scenario, variant: str, base_url: str) -> dict[str, Any]:
        from itlaudit import ledger
        from itlaudit.invariance_client import server_identity

        async def identify() -> dict[str, Any]:
            async with aiohttp.ClientSession() as session:
                model = await resolve_model(session, base_url, scenario.model)
                return await server_identity(session, base_url, model)

        fingerprint = ledger.variant_fingerprint(scenario, variant, asyncio.run(identify()), os.environ)
        ledger.check_new_run(fingerprint, self.path, self.force)
        return fingerprint.to_json()

    def record(self, run_dir: Path) -> None:
        from itlaudit import ledger

        ledger.record_run(run_dir, self.path, force=self.force, environ=os.environ)


@dataclass
class RunOutcome:
    run_dir: Path
    summary: dict[str, Any]
    records: list[RequestRecord]

    @property
    def finding_count(self) -> int:
        per_variant = sum(sum(b["findings"].values()) for b in self.summary["variants"].values())
        return per_variant


def _expand(text: str) -> str:
    """`{python}` is this interpreter, `{cache}` itlaudit's cache folder (testbed venvs, models):
    so a shipped scenario can name the testbed without knowing where this machine keeps it."""
    from itlaudit.testbed import default_cache_dir

    return text.replace("{python}", sys.executable).replace("{cache}", str(default_cache_dir()))


def launch_spec(config: LaunchConfig) -> LaunchSpec:
    from itlaudit.launcher import LaunchSpec

    def opt(value: str | None) -> str | None:
        return _expand(value) if value is not None else None

    return LaunchSpec(
        kind=config.kind,  # type: ignore[arg-type]  # validated against LAUNCH_KINDS by the scenario
        python=opt(config.python),
        image=config.image,
        command=[_expand(part) for part in config.command],
        model=opt(config.model),
        served_model_name=config.served_model_name,
        server_args=[_expand(arg) for arg in config.server_args],
        env=dict(config.env),
        ready_timeout_s=config.ready_timeout_s,
    )


def server_log_name(variant: str) -> str:
    return f"server-{variant}.log"


@contextmanager
def variant_target(variant: Variant, override_url: str | None, run_dir: Path) -> Iterator[str]:
    """Yield the base URL for a variant, starting (and always stopping) its server when it has one."""
    if override_url:
        yield override_url
        return
    if variant.launch is not None:
        from itlaudit.launcher import launch

        spec = launch_spec(variant.launch)
        # Tags the server's processes with the run that owns them, so a leftover is traceable.
        spec.env[RUN_DIR_ENV] = str(run_dir.resolve())
        with launch(spec, run_dir / server_log_name(variant.name)) as server:
            yield server.url
        return
    if variant.url:
        yield variant.url
        return
    raise ScenarioError(
        f"variant {variant.name!r} has no `url` and no [variants.launch]; add one, or pass --url / "
        f"--variant {variant.name}=URL"
    )


def run_scenario(
    scenario: Scenario,
    *,
    url: str | None = None,
    variant_urls: dict[str, str] | None = None,
    run_dir: Path | None = None,
    console: Console | None = None,
    before_variant: VariantHook | None = None,
    after_variant: VariantHook | None = None,
    ledger: LedgerPolicy | None = None,
    capture: CaptureOptions | None = None,
) -> RunOutcome:
    """Run every variant in turn. With a ledger, a variant whose fingerprint (build, args, env,
    workload) was already run is refused before it is measured, and the finished run is recorded."""
    variant_urls = variant_urls or {}
    unknown = set(variant_urls) - {v.name for v in scenario.variants}
    if unknown:
        names = ", ".join(v.name for v in scenario.variants)
        raise ScenarioError(f"--variant names {', '.join(sorted(unknown))}, not in the scenario ({names})")
    if run_dir is None:
        run_dir = new_run_dir(DEFAULT_REPORTS, scenario.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "itlaudit_version": __version__,
        "scenario": scenario.name,
        "scenario_path": str(scenario.path) if scenario.path else None,
        "endpoint": scenario.endpoint,
        "started_at_unix": time.time(),
        "environment": host_environment(),
        "variants": {},
    }
    write_json(run_dir / META_FILE, meta)
    records: list[RequestRecord] = []
    total = scenario.workload.num_requests * len(scenario.variants)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress, RecordWriter(run_dir / REQUESTS_FILE) as writer:
        task = progress.add_task("requests", total=total)
        for variant in scenario.variants:
            override = url or variant_urls.get(variant.name)
            with variant_target(variant, override, run_dir) as base_url:
                meta["variants"][variant.name] = {"url": base_url}
                if ledger is not None:
                    meta["variants"][variant.name]["fingerprint"] = ledger.check(
                        scenario, variant.name, base_url
                    )
                if before_variant is not None:
                    meta["variants"][variant.name]["before"] = before_variant(variant.name, base_url)
                progress.update(task, description=f"{variant.name} @ {base_url}")

                def on_capture(workers: dict[str, Any], name: str = variant.name) -> None:
                    """The capture workers (pids, clock offsets) land in meta.json before they stream."""
                    meta["variants"][name].update(workers)
                    write_json(run_dir / META_FILE, meta)

                done = asyncio.run(
                    run_variant(
                        scenario,
                        variant.name,
                        base_url,
                        writer,
                        lambda _r: progress.advance(task),
                        options=capture,
                        on_capture=on_capture,
                    )
                )
                records += done
                launched = variant.launch if not override else None
                meta["variants"][variant.name]["environment"] = server_environment(
                    base_url,
                    [r.system_fingerprint for r in done],
                    launch_env=launched.env if launched else None,
                    launch_kind=launched.kind if launched else None,
                    log_path=run_dir / server_log_name(variant.name) if launched else None,
                )
                if after_variant is not None:
                    meta["variants"][variant.name]["after"] = after_variant(variant.name, base_url)
            write_json(run_dir / META_FILE, meta)
    summary = write_derived(run_dir, scenario.name, [v.name for v in scenario.variants])
    if ledger is not None:
        ledger.record(run_dir)
    return RunOutcome(run_dir=run_dir, summary=summary, records=records)
