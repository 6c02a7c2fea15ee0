"""`itlaudit invariance` as a workflow: for each variant (one server at a time), score the prompts
alone, repeated and batched, derive the figures, and keep them with the raw scorings in invariance.json.
The command parses its options and prints what each variant yields."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itlaudit.analysis.invariance import PromptObservations, figures_json, prompt_figures, summarize
from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import Variant, load_scenario
from itlaudit.store.rundir import write_versioned
from itlaudit.workflows.server import VariantServer
from itlaudit.workflows.signals import run_until_stopped

if TYPE_CHECKING:
    from itlaudit.capture.server_info import ServerIdentity

INVARIANCE_FILE = "invariance.json"
DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Answer A or B:",
    "Speculative decoding proposes draft tokens and verifies them in one forward pass.",
)


@dataclass(frozen=True)
class InvarianceSettings:
    """How each variant is scored: the prompts, the served model ("auto": the first served), scorings
    per mode, logprobs candidates, the decision's token ids, the concurrent pair, the sweep's sizes."""

    prompts: Sequence[str]
    model: str
    repeats: int
    top_k: int
    choices: list[int] | None
    concurrent: bool
    sweep_sizes: list[int]


@dataclass(frozen=True)
class VariantInvariance:
    """One variant's result, as invariance.json holds it under the variant's name."""

    name: str
    url: str
    identity: ServerIdentity
    summary: dict[str, Any]


def invariance_targets(
    scenario_path: Path | None, url: str | None
) -> tuple[list[Variant], list[str], str | None]:
    """The servers to score (a --url is a variant of its own), the scenario's prompts and model."""
    if url:
        return [Variant(name="url", url=url.rstrip("/"))], [], None
    if scenario_path is None:
        raise ScenarioError("give a SCENARIO file or --url URL to score against")
    scenario = load_scenario(scenario_path)
    return list(scenario.variants), list(scenario.workload.prompts), scenario.model


def invariance_audit(
    variants: Sequence[Variant], settings: InvarianceSettings, run_dir: Path
) -> Iterator[VariantInvariance]:
    """Each variant's result as it finishes; invariance.json is rewritten after each, so an interrupted
    audit keeps the variants it finished. One server at a time: two would share the cores and the
    timing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for variant in variants:
        with VariantServer.open(variant, run_dir) as server:
            base_url = server.url
            served, identity, observations = run_until_stopped(_score(base_url, settings))
        figures = [prompt_figures(o, settings.choices) for o in observations]
        summary = summarize(figures)
        results[variant.name] = {
            "url": base_url,
            "model": served,
            "server": identity,
            "repeats": settings.repeats,
            "top_k": settings.top_k,
            "choices": settings.choices,
            "summary": summary,
            "prompts": figures_json(figures),
            "observations": [o.to_json() for o in observations],
        }
        write_versioned(run_dir / INVARIANCE_FILE, results)
        yield VariantInvariance(variant.name, base_url, identity, summary)


async def _score(
    base_url: str, settings: InvarianceSettings
) -> tuple[str, ServerIdentity, list[PromptObservations]]:
    from itlaudit.capture.planning import resolve_model
    from itlaudit.capture.scoring import observe, scorer_for
    from itlaudit.capture.server_info import server_identity
    from itlaudit.side.client import SideClient

    async with SideClient() as client:
        model = await resolve_model(client, base_url, settings.model)
        identity = await server_identity(client, base_url, model)
        scorer = await scorer_for(client, base_url, model, top_k=settings.top_k)
        observations = [
            await observe(
                scorer,
                prompt,
                settings.repeats,
                concurrent=settings.concurrent,
                sweep_sizes=settings.sweep_sizes,
            )
            for prompt in settings.prompts
        ]
    return model, identity, observations
