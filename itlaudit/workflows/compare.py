"""`itlaudit compare`: run every variant with /metrics scraped around it, then compare.json.

/metrics is read with urllib between variants, never while requests stream, so scraping cannot
disturb the timing it sits beside.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console

from itlaudit.analysis.comparison import build_comparison
from itlaudit.analysis.findings import Finding
from itlaudit.analysis.lossless import prompt_index, with_execution_modes
from itlaudit.analysis.specdecode import CounterSnapshot, spec_decode_delta
from itlaudit.capture.runner import CaptureOptions, variant_access
from itlaudit.capture.scoring import Scorer, explain_mismatch
from itlaudit.capture.server_info import scrape_counters
from itlaudit.model.codes import SPEC_DECODE_OUTPUT_MISMATCH
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_labels import RunLabels
from itlaudit.model.scenario import COMPILED, EAGER, Scenario, Variant
from itlaudit.report.progress import Reporter
from itlaudit.store.rundir import COMPARE_FILE, write_json
from itlaudit.workflows.derive import write_derived
from itlaudit.workflows.run import LedgerPolicy, RunOutcome, run_scenario

__all__ = ["execution_mode", "explain_mismatches", "run_compare"]


def _judged_by_modes(
    found: dict[str, Any], modes: dict[str, str | None], variant_of: dict[str, str]
) -> dict[str, Any]:
    if found["code"] != SPEC_DECODE_OUTPUT_MISMATCH:
        return found
    evidence = found.get("evidence", {})
    base = variant_of.get(str(evidence.get("base_request_id")))
    spec = variant_of.get(str(evidence.get("spec_request_id")))
    judged = with_execution_modes(Finding.from_json(found), modes.get(str(base)), modes.get(str(spec)))
    return judged.to_json()


async def explain_mismatches(
    scenario: Scenario,
    records: list[RequestRecord],
    findings: list[dict[str, Any]],
    live_urls: dict[str, str | None],
) -> list[dict[str, Any]]:
    """Add both servers' top logprobs at each greedy divergence, so a human can tell batch variance
    from a bug. Only servers still running can be asked: launched ones are gone by now, and their
    mismatch findings keep the position alone."""
    by_id = {r.request_id: r for r in records}
    out = []
    async with aiohttp.ClientSession() as session:
        for found in findings:
            evidence = found.get("evidence", {})
            base, spec = (
                by_id.get(evidence.get("base_request_id")),
                by_id.get(evidence.get("spec_request_id")),
            )
            urls = (
                (live_urls.get(base.variant), live_urls.get(spec.variant)) if base and spec else (None, None)
            )
            if found["code"] != SPEC_DECODE_OUTPUT_MISMATCH or base is None or spec is None or None in urls:
                out.append(found)
                continue
            prompt = scenario.prompt_for(int(prompt_index(base)))
            explained = await explain_mismatch(
                Finding.from_json(found),
                prompt,
                Scorer(session, str(urls[0]), base.model),
                Scorer(session, str(urls[1]), spec.model),
            )
            out.append(explained.to_json())
    return out


def execution_mode(variant: Variant, overridden: bool) -> str | None:
    """Declared in the scenario, else read from a server we launch (--enforce-eager or not); unknown
    for a server given by URL that the scenario says nothing about."""
    if variant.execution_mode is not None:
        return variant.execution_mode
    if variant.launch is None or overridden:
        return None
    return EAGER if "--enforce-eager" in variant.launch.server_args else COMPILED


def run_compare(
    scenario: Scenario,
    *,
    url: str | None = None,
    variant_urls: dict[str, str] | None = None,
    run_dir: Path | None = None,
    console: Console | None = None,
    ledger: LedgerPolicy | None = None,
    append: bool = False,
    capture: CaptureOptions | None = None,
    labels: RunLabels | None = None,
) -> tuple[RunOutcome, dict[str, Any]]:
    snapshots: dict[str, dict[str, Any]] = {}

    def before(name: str, base_url: str) -> dict[str, Any]:
        snapshots[f"{name}/before"] = scrape_counters(
            base_url, access=variant_access(scenario, name, capture)
        )
        return snapshots[f"{name}/before"]

    def after(name: str, base_url: str) -> dict[str, Any]:
        snapshots[f"{name}/after"] = scrape_counters(base_url, access=variant_access(scenario, name, capture))
        return snapshots[f"{name}/after"]

    outcome = run_scenario(
        scenario,
        url=url,
        variant_urls=variant_urls,
        run_dir=run_dir,
        console=console,
        before_variant=before,
        after_variant=after,
        ledger=ledger,
        append=append,
        capture=capture,
        labels=labels,
    )
    spec_stats = {}
    for variant in scenario.variants:
        pre, post = snapshots.get(f"{variant.name}/before", {}), snapshots.get(f"{variant.name}/after", {})
        usable = "error" not in pre and "error" not in post
        spec_stats[variant.name] = (
            spec_decode_delta(CounterSnapshot.from_json(pre), CounterSnapshot.from_json(post))
            if usable
            else None
        )
    comparison = build_comparison(outcome.summary, outcome.records, spec_stats)
    # Servers given by URL are still up; launched ones were stopped after their variant.
    overrides = variant_urls or {}
    live = {v.name: url or overrides.get(v.name) or (None if v.launch else v.url) for v in scenario.variants}
    explained = asyncio.run(explain_mismatches(scenario, outcome.records, comparison["findings"], live))
    modes = {v.name: execution_mode(v, bool(url or overrides.get(v.name))) for v in scenario.variants}
    by_id = {r.request_id: r.variant for r in outcome.records}
    comparison["findings"] = [_judged_by_modes(found, modes, by_id) for found in explained]
    write_json(outcome.run_dir / COMPARE_FILE, comparison)
    # Again, now that compare.json exists: the report's acceptance-per-position plot reads it.
    with Reporter(console).step("adding the spec-decode figures to the report"):
        write_derived(outcome.run_dir, scenario.name, [v.name for v in scenario.variants])
    return outcome, comparison
