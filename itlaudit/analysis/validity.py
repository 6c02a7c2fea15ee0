"""Whether a variant's figures may be compared at all: THE one rule behind every "faster", "better"
and "worse" that itlaudit writes (report, plots, diff, sweep, bisect, smoke, track, the terminal).

A variant whose outputs were cut short or whose requests failed did not run the workload that was
asked for, so its latency is not a speed (vLLM #47297's K=3 "regression" was a server stopping at 128
tokens; the same cap reads as a speedup just as easily). Such a variant is never ranked; it is
labelled "not comparable" with the numbers that say why, and a comparison against a base that is
itself not comparable is not comparable either.

Output quality gates relatively (QualityGate.RELATIVE, the default): a variant whose text is mostly
gibberish where its baseline's is not (seed 003: K3 broken, K0 clean) is not comparable; when the
baseline writes gibberish too — random weights (`--load-format dummy`, how most vLLM performance work
runs), a stand-in server — both ran the same workload, their speeds are compared, and every output
says so in one phrase (`quality_note`). A baseline, or a single variant, never hides its figures behind
a quality warning. STRICT is the earlier rule (gibberish gates every variant), OFF never gates on it.

The rule reads a run's summary only (per-variant finding counts, errors, the run-level common_cap
evidence, the gate and the variants on dummy weights), as the typed `RunSummary` every reader of a run
folder, old or new, holds (store/folder.RunFiles decodes summary.json into it), so every one applies the
same rule to the same file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from itlaudit.analysis.summary import RunSummary, VariantSummary
from itlaudit.model.codes import COMMON_CAP, GIBBERISH_SUSPECTED, TRUNCATION_CODES
from itlaudit.model.jsonvalue import JSONMapping
from itlaudit.model.vocabulary import QualityGate

NOT_COMPARABLE = "not comparable"


@dataclass(frozen=True)
class Validity:
    """Whether a variant (or a comparison of two) may be ranked; `reason` says why not, with numbers."""

    comparable: bool
    reason: str | None = None

    @property
    def label(self) -> str:
        """The text a table, plot or terminal writes beside it: "not comparable: <reason>", or ""."""
        return f"{NOT_COMPARABLE}: {self.reason}" if not self.comparable else ""


COMPARABLE = Validity(True)


class BlockCounts(TypedDict, total=False):
    """What the rule reads of one variant: a summary.json block's request, error and finding counts
    (block_counts), a bisect probe's figures as bisect.json keeps them (bisect/figures.ProbeFigures has
    these keys) or a smoke variant's. Not total: a probe an older itlaudit wrote may lack a key, and
    smoke judges a variant it did not measure as `{}`; a missing count reads as 0."""

    requests: int
    errors: int
    findings: dict[str, int]


@dataclass(frozen=True)
class CommonCap:
    """The run-level common_cap finding's evidence for one variant: the cap its requests share and how
    many stopped at it (None where the evidence does not say)."""

    cap: str
    requests_at_cap: int | None


def _common_cap(run_findings: Iterable[JSONMapping], variant: str) -> CommonCap | None:
    """The run-level common_cap evidence for this variant, when its requests share one cap."""
    for finding in run_findings:
        evidence = finding.get("evidence")
        if finding.get("code") != COMMON_CAP or not isinstance(evidence, Mapping):
            continue
        if evidence.get("variant") == variant:
            at_cap = evidence.get("requests_at_cap")
            return CommonCap(str(evidence.get("cap")), at_cap if isinstance(at_cap, int) else None)
    return None


def _truncation_reason(cap: CommonCap | None, cut: int, requests: int) -> str:
    if cap is None:
        return f"{cut} of {requests} requests cut short"
    at_cap = cut if cap.requests_at_cap is None else cap.requests_at_cap
    if at_cap >= cut:
        return f"{at_cap} of {requests} requests capped at {cap.cap} tokens"
    return f"{cut} of {requests} requests cut short, {at_cap} of them capped at {cap.cap} tokens"


def mostly_gibberish(block: BlockCounts) -> bool:
    """gibberish_suspected on most (more than half) of a block's requests: one gibberish request in
    ten is a sampling accident, not what the variant writes."""
    counts = block.get("findings") or {}
    return int(counts.get(GIBBERISH_SUSPECTED, 0)) * 2 > int(block.get("requests") or 0)


def _quality_gates(gate: QualityGate, own: bool, base: BlockCounts | None) -> bool:
    """Whether gibberish takes this block out: STRICT whenever it is mostly gibberish, RELATIVE only
    against a baseline (`base`, None for the baseline itself or a single variant) whose outputs are
    not, OFF never."""
    if gate is QualityGate.OFF or not own:
        return False
    return gate is QualityGate.STRICT or (base is not None and not mostly_gibberish(base))


def block_validity(
    block: BlockCounts,
    common_cap: CommonCap | None = None,
    *,
    base: BlockCounts | None = None,
    gate: QualityGate = QualityGate.RELATIVE,
) -> Validity:
    """The rule on one summary.json variant block (a sweep trial or a bisect probe has no run-level
    findings beside it; `common_cap` is the common_cap finding's evidence, when known, to name the cap
    in the reason). `base` is the baseline's block measured beside it (same load, same build), None
    when `block` is the baseline or stands alone.

    Not comparable when any request was cut short (any of TRUNCATION_CODES), any request failed, or
    the quality gate takes it out (`_quality_gates`). A single truncated or failed request is not an
    accident: the workload was not the one asked for.
    """
    requests = int(block.get("requests") or 0)
    if requests == 0:
        return Validity(False, "no requests recorded")
    counts = block.get("findings") or {}
    reasons = []
    # A request may carry several truncation codes: the most frequent one counts the cut requests.
    cut = max((int(counts.get(code, 0)) for code in TRUNCATION_CODES), default=0)
    if cut:
        reasons.append(_truncation_reason(common_cap, cut, requests))
    if errors := int(block.get("errors") or 0):
        reasons.append(f"{errors} of {requests} requests failed")
    if _quality_gates(gate, mostly_gibberish(block), base):
        gibberish = int(counts.get(GIBBERISH_SUSPECTED, 0))
        where = " where the baseline's do not" if base is not None and not mostly_gibberish(base) else ""
        reasons.append(f"{gibberish} of {requests} requests look like gibberish{where}")
    return Validity(False, "; ".join(reasons)) if reasons else COMPARABLE


def block_counts(block: VariantSummary) -> BlockCounts:
    """What block_validity reads of a summary's variant block."""
    return {"requests": block.requests, "errors": block.errors, "findings": block.findings}


def _blocks(summary: RunSummary) -> dict[str, BlockCounts]:
    """Each variant's counts in block_validity's form, in scenario order."""
    return {name: block_counts(b) for name, b in summary.variants.items()}


def variant_validity(summary: RunSummary, variant: str) -> Validity:
    """The rule on a run's summary: block_validity of the variant's block against the run's baseline
    (its first variant), under the run's quality gate, its cap named from the run-level common_cap
    finding. A variant the summary does not hold has no requests recorded."""
    blocks = _blocks(summary)
    block = blocks.get(variant)
    if block is None:
        return Validity(False, "no requests recorded")
    forced = summary.synthetic_acceptance.get(variant)
    if forced is not None:
        return Validity(
            False, f"synthetic acceptance ({forced}): its speed is a projection, not a measurement"
        )
    base_name = next(iter(blocks))
    base = None if variant == base_name else blocks[base_name]
    cap = _common_cap(summary.run_findings, variant)
    return block_validity(block, cap, base=base, gate=summary.quality_gate)


def quality_note(summary: RunSummary) -> str | None:
    """The one phrase every output writes when gibberish was measured and did not gate (the baseline
    writes it too, a single variant, or the gate is off): the speeds stand, the text was not judged.
    The variants whose servers load dummy weights are named as the reason. None when no variant is
    mostly gibberish, or every one that is was taken out (its validity label says so)."""
    blocks = _blocks(summary)
    if not blocks:
        return None
    names = list(blocks)
    judged = [n for n in names if mostly_gibberish(blocks[n]) and variant_validity(summary, n).comparable]
    if not judged:
        return None
    if len(names) == 1:
        where, speed = "outputs are gibberish", "speed measured"
    elif len(judged) == len(names):
        where = (
            "outputs are gibberish in both variants"
            if len(names) == 2
            else (f"outputs are gibberish in all {len(names)} variants")
        )
        speed = "speed compared"
    else:
        where, speed = f"outputs are gibberish in {', '.join(judged)}", "speed compared"
    dummy = summary.dummy_weights
    why = f" ({', '.join(dummy)}: dummy weights, --load-format dummy)" if dummy else ""
    gated = " (--quality-gate off)" if summary.quality_gate is QualityGate.OFF else ""
    return f"{where}{why}: {speed}, quality not judged{gated}"


def comparison_validity(variant: Validity, base: Validity, base_name: str) -> Validity:
    """A comparison of a variant against a base is only as comparable as both: the variant's own
    reason first, then the base's, named, since a faithful variant against a capped base is as
    meaningless as the reverse."""
    reasons: Iterable[str | None] = (
        variant.reason if not variant.comparable else None,
        f"base {base_name}: {base.reason}" if not base.comparable else None,
    )
    joined = "; ".join(r for r in reasons if r)
    return Validity(False, joined) if joined else COMPARABLE
