"""Whether a variant's figures may be compared at all: THE one rule behind every "faster", "better"
and "worse" that itlaudit writes (report, plots, diff, sweep, bisect, the terminal).

A variant whose outputs were cut short, whose requests failed, or whose text is mostly gibberish did
not run the workload that was asked for, so its latency is not a speed (vLLM #47297's K=3 "regression"
was a server stopping at 128 tokens; the same cap reads as a speedup just as easily). Such a variant
is never ranked; it is labelled "not comparable" with the numbers that say why, and a comparison
against a base that is itself not comparable is not comparable either.

The rule reads a run's summary only (per-variant finding counts, errors, the run-level common_cap
evidence), typed or as summary.json's dict, so every reader of a run folder, old or new, applies the
same rule to the same file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from itlaudit.analysis.summary import RunSummary
from itlaudit.model.codes import COMMON_CAP, GIBBERISH_SUSPECTED, TRUNCATION_CODES

__all__ = [
    "COMPARABLE",
    "NOT_COMPARABLE",
    "Validity",
    "block_validity",
    "comparison_validity",
    "variant_validity",
]

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


def _common_cap(run_findings: Iterable[Mapping[str, Any]], variant: str) -> Mapping[str, Any] | None:
    """The run-level common_cap evidence for this variant, when its requests share one cap."""
    for finding in run_findings:
        evidence = finding.get("evidence") or {}
        if finding.get("code") == COMMON_CAP and evidence.get("variant") == variant:
            return dict(evidence)
    return None


def _truncation_reason(cap: Mapping[str, Any] | None, cut: int, requests: int) -> str:
    if cap is None:
        return f"{cut} of {requests} requests cut short"
    at_cap = int(cap.get("requests_at_cap", cut))
    if at_cap >= cut:
        return f"{at_cap} of {requests} requests capped at {cap['cap']} tokens"
    return f"{cut} of {requests} requests cut short, {at_cap} of them capped at {cap['cap']} tokens"


def block_validity(
    block: Mapping[str, Any], common_cap: Mapping[str, Any] | None = None, *, gibberish_expected: bool = False
) -> Validity:
    """The rule on one summary.json variant block (a sweep trial has no run-level findings beside it;
    `common_cap` is the common_cap finding's evidence, when known, to name the cap in the reason).
    `gibberish_expected` is for a model that writes gibberish by construction (the CPU testbed's
    random-weight model), declared so by the caller: its speed can still be compared, gibberish is still
    reported, and truncation and failures still count. Nothing sets it by default.

    Not comparable when any request was cut short (any of TRUNCATION_CODES), any request failed, or
    gibberish_suspected fires on most (more than half) of the requests. One gibberish request in ten
    is a sampling accident and leaves the variant comparable; a single truncated or failed request is
    not an accident: the workload was not the one asked for.
    """
    return _rule(
        int(block.get("requests") or 0),
        int(block.get("errors") or 0),
        block.get("findings") or {},
        common_cap,
        gibberish_expected,
    )


def _rule(
    requests: int,
    errors: int,
    counts: Mapping[str, int],
    common_cap: Mapping[str, Any] | None,
    gibberish_expected: bool,
) -> Validity:
    """block_validity's rule on a block's request, failure and finding counts."""
    if requests == 0:
        return Validity(False, "no requests recorded")
    reasons = []
    # A request may carry several truncation codes: the most frequent one counts the cut requests.
    cut = max((int(counts.get(code, 0)) for code in TRUNCATION_CODES), default=0)
    if cut:
        reasons.append(_truncation_reason(common_cap, cut, requests))
    if errors:
        reasons.append(f"{errors} of {requests} requests failed")
    gibberish = int(counts.get(GIBBERISH_SUSPECTED, 0))
    if gibberish * 2 > requests and not gibberish_expected:
        reasons.append(f"{gibberish} of {requests} requests look like gibberish")
    return Validity(False, "; ".join(reasons)) if reasons else COMPARABLE


def variant_validity(summary: RunSummary | Mapping[str, Any], variant: str) -> Validity:
    """The rule on a run's summary (the struct, or summary.json's dict as a reader of a past folder
    holds it): block_validity of the variant's block, its cap named from the run-level common_cap
    finding. A variant the summary does not hold has no requests recorded."""
    if isinstance(summary, RunSummary):
        typed = summary.variants.get(variant)
        if typed is None:
            return _rule(0, 0, {}, None, False)
        cap = _common_cap(summary.run_findings, variant)
        return _rule(typed.requests, typed.errors, typed.findings, cap, False)
    block: Mapping[str, Any] = (summary.get("variants") or {}).get(variant) or {}
    return block_validity(block, _common_cap(summary.get("run_findings") or [], variant))


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
