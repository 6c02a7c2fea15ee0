"""What a result says about where it came from, beyond its figures: the workload as sent (meta.json's
"workload", written when the run starts) and who answered (a vLLM build or itlaudit's simulator).

A figure read without its context is how vLLM #47297 went wrong; and a simulated run recorded as
"vLLM 0.32.0" would put a simulator's numbers in a ledger beside real builds. So the simulator says
what it is in /version, /v1/models and its system_fingerprint, and every reader of a version string
asks `server_build` how to name it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from itlaudit import __version__
from itlaudit.model.meta import Meta, MetaVariant, WorkloadMeta
from itlaudit.model.scenario import Scenario
from itlaudit.model.vocabulary import QualityGate

# The name the simulator answers with: the start of its /version, its models' owned_by, and its
# system_fingerprint (`itlaudit-sim-<version>-<hash8>`, where vLLM's is `vllm-<version>-<hash8>`).
SIMULATOR = "itlaudit-sim"


def simulator_version() -> str:
    """The simulator's /version: its name and the itlaudit that serves it, never a vLLM version."""
    return f"{SIMULATOR} {__version__}"


# How a server's version reads when SGLang said it (its /server_info or /get_server_info `version`,
# where it has no /version): "sglang 0.5.14", never taken for a vLLM build.
SGLANG_VERSION_PREFIX = "sglang "


def is_sglang(version: str | None) -> bool:
    """Whether a server's version string came from SGLang's info endpoints."""
    return bool(version) and str(version).startswith(SGLANG_VERSION_PREFIX)


def is_simulator(version: str | None) -> bool:
    """Whether a /version string (or a system_fingerprint) is the simulator's, in either dialect."""
    return bool(version) and str(version).removeprefix(SGLANG_VERSION_PREFIX).startswith(SIMULATOR)


def server_build(version: str | None) -> str:
    """A server's build as a report names it: "vLLM 0.32.0", "SGLang 0.5.14", "itlaudit simulator
    (itlaudit-sim 0.1.0), not vLLM", or "unknown (no /version)" for servers that do not say
    (gateways, mocks)."""
    if not version:
        return "unknown (no /version)"
    if is_simulator(version):
        return f"itlaudit simulator ({version}), not vLLM"
    if is_sglang(version):
        return f"SGLang {version.removeprefix(SGLANG_VERSION_PREFIX)}"
    return f"vLLM {version}"


def _span(values: Iterable[int | None]) -> int | str | None:
    """One value as itself, several as "min–max", none as None: a workload's per-request lengths."""
    known = sorted({v for v in values if v is not None})
    if not known:
        return None
    return known[0] if len(known) == 1 else f"{known[0]}–{known[-1]}"


def workload_meta(scenario: Scenario) -> WorkloadMeta:
    """meta.json's "workload": what was asked of every variant, in vllm bench serve's terms where it
    has them (num_prompts, max_concurrency, request_rate None = no rate limit, vllm bench's "inf").
    The report's context block and the --save-result JSON read it."""
    workload = scenario.workload
    arrivals = workload.arrivals
    dataset = workload.dataset
    entries = dataset.entries if dataset is not None else []
    max_tokens = _span([workload.params.max_tokens] + [e.max_tokens for e in entries])
    return {
        "endpoint": scenario.endpoint,
        "model": scenario.model,
        "dataset": dataset.kind if dataset is not None else "prompts",
        "input_len": _span(len(e.prompt) for e in entries if isinstance(e.prompt, list)),
        "num_prompts": workload.num_requests,
        "max_concurrency": workload.concurrency,
        "request_rate": arrivals.request_rate,
        "burstiness": arrivals.burstiness,
        "duration_s": arrivals.duration_s,
        "duration_grace_s": arrivals.duration_grace_s if arrivals.duration_s is not None else None,
        "num_warmups": arrivals.warmup_requests,
        "max_tokens": max_tokens,
        "ignore_eos": workload.params.ignore_eos,
        "temperature": workload.params.temperature,
    }


class VariantMeta(NamedTuple):
    """One variant's part of meta.json as its result readers take it: the run's workload, the
    variant's entry, and the server's version string (vLLM's, the simulator's, or None)."""

    workload: WorkloadMeta
    info: MetaVariant
    version: str | None


def variant_meta(meta: Meta, variant: str) -> VariantMeta:
    """One variant out of meta.json; a part a run did not write is empty."""
    info = meta.variant(variant)
    return VariantMeta(workload=meta.workload or {}, info=info, version=info.version)


class QualitySettings(NamedTuple):
    """What the validity rule needs of meta.json beyond the records: the run's quality gate and the
    variants whose launched server loads dummy weights (their gibberish is by construction)."""

    gate: QualityGate = QualityGate.RELATIVE
    dummy_weights: tuple[str, ...] = ()
    # variant -> how its acceptance is forced (vLLM's rejection_sample_method "synthetic"): its speed is
    # a projection at that acceptance, never a measured result (analysis.validity)
    synthetic: tuple[tuple[str, str], ...] = ()


def quality_settings(meta: Meta) -> QualitySettings:
    """From meta.json (its gate checked when it was read); a folder written before the gate existed
    is judged relatively."""
    dummy = tuple(name for name, info in meta.variants.items() if info.load_format == "dummy")
    synthetic = tuple(
        (name, forced)
        for name, info in meta.variants.items()
        if (forced := synthetic_acceptance(info.speculative_config))
    )
    return QualitySettings(meta.quality_gate or QualityGate.RELATIVE, dummy, synthetic)


def synthetic_acceptance(config: object) -> str | None:
    """How a speculative config forces acceptance, in words ("acceptance length 3.5 forced"), or None
    where it does not: vLLM's `rejection_sample_method = "synthetic"` with synthetic_acceptance_length
    or synthetic_acceptance_rates (PRs #38045, #40662, #41035)."""
    if not isinstance(config, Mapping) or config.get("rejection_sample_method") != "synthetic":
        return None
    length, rates = config.get("synthetic_acceptance_length"), config.get("synthetic_acceptance_rates")
    if isinstance(length, int | float):
        return f"acceptance length {length:g} forced"
    if isinstance(rates, list) and rates:
        return f"acceptance rates {', '.join(f'{r:g}' for r in rates if isinstance(r, int | float))} forced"
    return "acceptance forced"
