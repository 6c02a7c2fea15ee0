"""Findings: the rules that say when a benchmark number cannot be taken at face value, run together.

A latency comparison is only meaningful when both sides generated what was asked for and the token
counts behind the ITL are the server's own. These rules look for the ways that silently fails: an
output cut short (vLLM #47297: a K=3 MTP "regression" from 10 ms to 72 ms ITL was a server stopping at
128 tokens), ignored sampling limits, and streams whose usage counts are missing or inconsistent.
Every finding carries the numbers that made it fire, so a reader can check the rule, not trust it.

The per-request rules live in output_rules (what was generated against what was asked) and
stream_rules (how it was delivered and counted); the run-level rule (common_cap) is here. Codes, their
severities and meanings are registered in itlaudit.model.codes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from itlaudit.analysis.metrics import RequestMetrics
from itlaudit.analysis.output_rules import (
    COMPLETIONS_DEFAULT_TEXT,
    completions_default_stop,
    cut_short,
    exact_tokens,
    gibberish_finding,
    ignore_eos_finding,
    min_tokens_finding,
    prompt_tokens_finding,
    reasoning_truncated_finding,
    stop_ids_finding,
    stop_reason_finding,
    truncation_finding,
)
from itlaudit.analysis.quality import DEFAULT_THRESHOLDS, GibberishThresholds
from itlaudit.analysis.request_acceptance import server_acceptance_finding
from itlaudit.analysis.stream_rules import (
    client_saturated_finding,
    coalesced_finding,
    transport_findings,
    usage_missing_finding,
    usage_non_monotonic_finding,
)
from itlaudit.model.codes import (
    COMMON_CAP,
    TRUNCATION_CODES,
    Finding,
    Scope,
    codes_in,
)
from itlaudit.model.records import RequestRecord, Status

# STREAM_ERROR and the other codes below are re-exported for bisect/verdict.py, which reads them here.

# The codes these rules emit (the comparison codes come from comparison and lossless; launch_bound, a
# variant's, from roofline, which judges the server block beside the floor).
CODES = codes_in(Scope.REQUEST, Scope.VARIANT)

# A shared cap needs repeated evidence: one or two requests ending at the same length can be chance
# (and each is already reported by truncated_below_max_tokens); three at an identical count is a limit.
COMMON_CAP_MIN_REQUESTS = 3
# At least half of the finished requests must hit the cap for it to explain the variant's numbers
# rather than a handful of outliers.
COMMON_CAP_MIN_SHARE = 0.5


def request_findings(
    record: RequestRecord, metrics: RequestMetrics, quality: GibberishThresholds = DEFAULT_THRESHOLDS
) -> list[Finding]:
    """Every per-request rule that fires for this record, in CODES order."""
    tokens = exact_tokens(record, metrics)
    candidates = [
        truncation_finding(record, tokens),
        reasoning_truncated_finding(record, tokens),
        ignore_eos_finding(record, tokens),
        min_tokens_finding(record, tokens),
        stop_ids_finding(record),
        stop_reason_finding(record),
        usage_missing_finding(record, metrics),
        usage_non_monotonic_finding(record),
        coalesced_finding(record, metrics),
        client_saturated_finding(record, metrics),
        server_acceptance_finding(record),
        prompt_tokens_finding(record),
    ]
    found = [f for f in candidates if f is not None] + transport_findings(record, metrics)
    gibberish = gibberish_finding(record, quality)
    return found + ([gibberish] if gibberish is not None else [])


def run_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """Run-level rules: a cap shared by most of a variant's requests explains its numbers wholesale.

    Only the server's own completion counts are used: equality at one value is the signal, and a
    chunk count could not show it.
    """
    by_variant: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)

    out = []
    for variant, group in by_variant.items():
        finished = [r for r in group if r.status == Status.OK]
        cut = [r for r in finished if r.completion_tokens is not None and cut_short(r, r.completion_tokens)]
        if not cut:
            continue
        cap, hits = Counter(r.completion_tokens for r in cut).most_common(1)[0]
        share = hits / len(finished)
        if hits < COMMON_CAP_MIN_REQUESTS or share < COMMON_CAP_MIN_SHARE:
            continue
        at_cap = [r for r in cut if r.completion_tokens == cap]
        max_tokens = sorted({r.params.max_tokens for r in at_cap if r.params.max_tokens is not None})
        unset = sum(r.params.max_tokens is None for r in at_cap)
        asked = ", ".join([*map(str, max_tokens), *(["unset"] if unset else [])])
        default = unset == hits and all(
            completions_default_stop(r.endpoint, None, r.completion_tokens) for r in at_cap
        )
        cause = f": {COMPLETIONS_DEFAULT_TEXT}. That default" if default else ", so a server-side cap"
        message = (
            f"Variant {variant!r}: {hits} of {len(finished)} finished requests stopped at exactly {cap} "
            f"tokens with finish_reason 'length' (max_tokens requested: {asked}){cause}, "
            "not a latency change, explains this variant's numbers."
        )
        evidence = {
            "variant": variant,
            "cap": cap,
            "requests_at_cap": hits,
            "finished_requests": len(finished),
            "share": share,
            "max_tokens": max_tokens,
            "requests_without_max_tokens": unset,
            "completions_default": default,
            "request_ids": [r.request_id for r in at_cap],
        }
        out.append(Finding.of(COMMON_CAP, message, evidence))
    return out


def truncated_requests(findings: Iterable[Finding]) -> frozenset[str]:
    """The requests these findings call cut short: any of TRUNCATION_CODES."""
    return frozenset(f.request_id for f in findings if f.code in TRUNCATION_CODES and f.request_id)
