"""`itlaudit compare`: run every variant with /metrics scraped around it, then compare.json.

/metrics is read between variants, never while requests stream, so scraping cannot
disturb the timing it sits beside.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from itlaudit.analysis.comparison import CompareResult, build_comparison
from itlaudit.analysis.distribution import distribution_shift, sampled, speculates
from itlaudit.analysis.lossless import prompt_index, with_execution_modes, without_logprobs
from itlaudit.analysis.specdecode import CounterSnapshot, spec_decode_delta, step_token_limit
from itlaudit.analysis.workloads import prefix_cache_delta
from itlaudit.capture.planning import sent_prompt
from itlaudit.capture.request_plan import Prompt
from itlaudit.capture.runner import CaptureOptions, variant_access
from itlaudit.capture.scoring import Scorer, explain_mismatch, score_outputs, scorer_for
from itlaudit.capture.server_info import scrape_counters
from itlaudit.errors import ItlauditError
from itlaudit.model.access import Access
from itlaudit.model.codes import SPEC_DECODE_OUTPUT_MISMATCH, Finding
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_labels import RunLabels
from itlaudit.model.scenario import COMPILED, EAGER, Scenario, Variant
from itlaudit.model.vocabulary import Endpoint
from itlaudit.report.progress import Reporter
from itlaudit.side.client import SideClient
from itlaudit.store.rundir import COMPARE_FILE, write_versioned
from itlaudit.workflows.derive import with_comparison, write_report
from itlaudit.workflows.ledger import LedgerPolicy
from itlaudit.workflows.run import RunOutcome, run_scenario
from itlaudit.workflows.run_folder import RunFolder
from itlaudit.workflows.server import VariantServer
from itlaudit.workflows.signals import run_until_stopped
from itlaudit.workflows.variant_pass import WindowHook

# Why a chat scenario's sampled outputs are not scored: the server's chat template wraps the messages,
# so the ids the output followed are not known to score after.
_CHAT_NOT_SCORED = (
    "chat outputs are not scored: the server's chat template wraps the messages, so the prompt's token ids "
    "are not known; run the scenario on /v1/completions or, on SGLang, /generate"
)


def _judged_by_modes(
    found: Finding, modes: dict[str, str | None], variant_of: dict[str, str], comparison: CompareResult
) -> Finding:
    """A mismatch between servers of different execution modes is judged as numerics, never by the
    speculative-decoding rule, where it sits at a near tie or its variant does not speculate."""
    if found.code != SPEC_DECODE_OUTPUT_MISMATCH:
        return found
    base = variant_of.get(str(found.evidence.get("base_request_id")))
    spec = variant_of.get(str(found.evidence.get("spec_request_id")))
    row = comparison.variants.get(str(spec))
    drafts = row is None or speculates(row)
    return with_execution_modes(found, modes.get(str(base)), modes.get(str(spec)), speculates=drafts)


async def explain_mismatches(
    scenario: Scenario,
    records: list[RequestRecord],
    findings: Sequence[Finding],
    live_urls: dict[str, str | None],
) -> list[Finding]:
    """Add both servers' top logprobs at each greedy divergence, so a human can tell batch variance
    from a bug. Only servers still running can be asked: launched ones are gone by now, and their
    mismatch findings keep the position alone. A scoring that fails (a server that refuses it, died,
    or answers in a shape not understood) leaves that mismatch unexplained and says why: the
    comparison stands either way."""
    by_id = {r.request_id: r for r in records}
    out = []
    scorers: dict[tuple[str, str], Scorer] = {}
    async with SideClient() as client:

        async def scorer(url: str, model: str) -> Scorer:
            if (url, model) not in scorers:
                scorers[url, model] = await scorer_for(client, url, model)
            return scorers[url, model]

        for found in findings:
            base, spec = (
                by_id.get(str(found.evidence.get("base_request_id"))),
                by_id.get(str(found.evidence.get("spec_request_id"))),
            )
            urls = (
                (live_urls.get(base.variant), live_urls.get(spec.variant)) if base and spec else (None, None)
            )
            if found.code != SPEC_DECODE_OUTPUT_MISMATCH or base is None or spec is None or None in urls:
                out.append(without_logprobs(found))
                continue
            prompt = scenario.prompt_for(int(prompt_index(base)))
            try:
                both = await scorer(str(urls[0]), base.model), await scorer(str(urls[1]), spec.model)
                out.append(await explain_mismatch(found, prompt, *both))
            except ItlauditError as exc:
                out.append(without_logprobs(found, str(exc)))
    return out


async def _score_distribution(
    scenario: Scenario,
    sampled_by_variant: dict[str, list[RequestRecord]],
    audited: list[str],
    url: str,
    access: Access,
) -> tuple[JSONObject, list[Finding]]:
    baseline = scenario.variants[0].name
    figures_by_variant: JSONObject = {}
    findings = []

    def prompt_of(record: RequestRecord) -> Prompt:
        return sent_prompt(scenario, int(prompt_index(record)))

    async with SideClient(access) as client:
        # The model name the baseline's server answered to (a scenario may say "auto").
        scorer = await scorer_for(client, url, sampled_by_variant[baseline][0].model)
        base = await score_outputs(scorer, sampled_by_variant[baseline], prompt_of)
        for name in audited:
            spec = await score_outputs(scorer, sampled_by_variant[name], prompt_of)
            figures_by_variant[name], finding = distribution_shift(baseline, name, base, spec)
            if finding is not None:
                findings.append(finding)
    return figures_by_variant, findings


def audit_distribution(
    scenario: Scenario,
    outcome: RunOutcome,
    comparison: CompareResult,
    live_urls: dict[str, str | None],
    forced: bool | None = None,
    capture: CaptureOptions | None = None,
    console: Console | None = None,
) -> tuple[JSONObject | None, list[Finding]]:
    """Lossless at temperature > 0 (analysis/distribution.py): every sampled output of the baseline
    and of each audited variant scored under the baseline's server, per-token log-likelihoods
    compared. Audited: each variant that speculates and sampled (forced None), every variant that
    sampled (True: a K0-vs-K0 control, two builds), none (False). A baseline server the run launched
    has stopped by now, so it is launched once more for the scoring (its log: server-<name>-scoring.log)
    and stopped after. Returns compare.json's distribution block (None when nothing was audited) and
    its findings; a block that could not be scored says why in `skipped`, and the run's other results
    stand."""
    baseline = scenario.variants[0]
    records = outcome.records
    mine = {name: sampled([r for r in records if r.variant == name]) for name in comparison.variants}
    audited = [
        name
        for name, row in comparison.variants.items()
        if name != baseline.name
        and mine[name]
        and row.not_audited is None  # a synthetic acceptance is not lossless by construction
        and (forced or (forced is None and speculates(row)))
    ]
    if forced is False or not audited:
        return None, []
    block: JSONObject = {"scorer": baseline.name, "variants": {}}
    if scenario.endpoint == Endpoint.CHAT:  # /v1/completions and SGLang's /generate give both ids
        return {**block, "skipped": _CHAT_NOT_SCORED}, []
    if not mine.get(baseline.name):
        return {**block, "skipped": f"the baseline {baseline.name!r} has no sampled outputs to compare"}, []
    access = variant_access(scenario, baseline.name, capture)
    reporter = Reporter(console)
    try:
        with ExitStack() as stack:
            url = live_urls.get(baseline.name)
            if url is None:
                with reporter.step(f"{baseline.name}: starting its server again to score sampled outputs"):
                    again = replace(baseline, name=f"{baseline.name}-scoring")  # its own server log
                    url = stack.enter_context(VariantServer.open(again, outcome.run_dir, access=access)).url
            with reporter.step(f"scoring sampled outputs under {baseline.name}"):
                scoring = _score_distribution(scenario, mine, audited, url, access)
                figures, findings = run_until_stopped(scoring)
    except ItlauditError as exc:
        return {**block, "skipped": f"scoring under {baseline.name!r} failed: {exc}"}, []
    return {**block, "variants": figures}, findings


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
    distribution: bool | None = None,
) -> tuple[RunOutcome, CompareResult]:
    """`distribution`: audit_distribution's `forced` (None: automatic for speculating variants).
    The run's figures are derived once; the report is drawn after compare.json is written (its
    acceptance-per-position plot reads it), and drawn even when comparing fails."""
    window = CounterWindow(scenario, capture)
    outcome = run_scenario(
        scenario,
        url=url,
        variant_urls=variant_urls,
        run_dir=run_dir,
        console=console,
        hooks=[window],
        ledger=ledger,
        append=append,
        capture=capture,
        labels=labels,
        report=False,
    )
    try:
        comparison = _compare(
            scenario, outcome, window.snapshots, url, variant_urls, capture, console, distribution
        )
        # compare.json's findings are the run's: summary.json, the terminal block and the report
        # name them as compare.json does.
        outcome = replace(outcome, derivation=with_comparison(outcome.derivation, comparison))
    finally:
        write_report(outcome.derivation, reporter=Reporter(console))
    return outcome, comparison


class CounterWindow(WindowHook):
    """compare's /metrics window: the server's counters read as the measured window opens and as it
    closes (meta.json's `before` and `after`), for the spec-decode and prefix-cache deltas."""

    def __init__(self, scenario: Scenario, capture: CaptureOptions | None) -> None:
        self.scenario = scenario
        self.capture = capture
        self.snapshots: dict[str, JSONObject] = {}

    def _scrape(self, edge: str, variant: str, base_url: str) -> JSONObject:
        access = variant_access(self.scenario, variant, self.capture)
        self.snapshots[f"{variant}/{edge}"] = scrape_counters(base_url, access=access)
        return {edge: self.snapshots[f"{variant}/{edge}"]}

    def opened(self, variant: str, base_url: str, folder: RunFolder) -> JSONObject:
        return self._scrape("before", variant, base_url)

    def closed(self, variant: str, base_url: str, folder: RunFolder) -> JSONObject:
        return self._scrape("after", variant, base_url)


def _compare(
    scenario: Scenario,
    outcome: RunOutcome,
    snapshots: dict[str, JSONObject],
    url: str | None,
    variant_urls: dict[str, str] | None,
    capture: CaptureOptions | None,
    console: Console | None,
    distribution: bool | None,
) -> CompareResult:
    """compare.json from a finished run and its /metrics windows."""
    spec_stats, prefix_cache, step_tokens = {}, {}, {}
    for variant in scenario.variants:
        pre, post = snapshots.get(f"{variant.name}/before", {}), snapshots.get(f"{variant.name}/after", {})
        usable = "error" not in pre and "error" not in post
        counters = (CounterSnapshot.from_json(pre), CounterSnapshot.from_json(post))
        spec_stats[variant.name] = spec_decode_delta(*counters) if usable else None
        step_tokens[variant.name] = step_token_limit(*counters) if usable else None
        prefix_cache[variant.name] = prefix_cache_delta(*counters) if usable else None
    comparison = build_comparison(outcome.derivation.summary, outcome.records, spec_stats, step_tokens)
    for name, row in comparison.variants.items():
        row.prefix_cache = prefix_cache.get(name)
    # Servers given by URL are still up; launched ones were stopped after their variant.
    overrides = variant_urls or {}
    live = {v.name: url or overrides.get(v.name) or (None if v.launch else v.url) for v in scenario.variants}
    found = [Finding.from_json(line) for line in comparison.findings]
    explained = run_until_stopped(explain_mismatches(scenario, outcome.records, found, live))
    modes = {v.name: execution_mode(v, bool(url or overrides.get(v.name))) for v in scenario.variants}
    by_id = {r.request_id: r.variant for r in outcome.records}
    judged = [_judged_by_modes(finding, modes, by_id, comparison) for finding in explained]
    block, shifts = audit_distribution(scenario, outcome, comparison, live, distribution, capture, console)
    if block is not None:
        comparison.distribution = block
    comparison.findings = [finding.to_json() for finding in judged + shifts]
    write_versioned(outcome.run_dir / COMPARE_FILE, comparison.to_json())
    return comparison
