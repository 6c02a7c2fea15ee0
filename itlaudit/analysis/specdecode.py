"""Speculative-decoding acceptance from vLLM's /metrics counters (pure: text in, figures out).

The stream tells us tokens per chunk; the server's counters tell us how many drafts it proposed
and accepted. Both are needed: when they disagree, either the stream lost chunks or the counters
include traffic that was not ours.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from itlaudit.errors import MetricsParseError
from itlaudit.model.jsonvalue import JSONObject

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
# Prompt tokens looked up in / found in the prefix cache (analysis.workloads turns them into a hit rate).
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATION_TOKENS, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS)


@dataclass(frozen=True)
class CounterSnapshot:
    """The spec-decode counters at one instant, summed over engines (data-parallel ranks)."""

    totals: dict[str, float] = field(default_factory=dict)
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> JSONObject:
        return {
            "totals": dict(self.totals),
            "accepted_per_pos": {str(k): v for k, v in self.accepted_per_pos.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CounterSnapshot:
        per_pos = {int(k): float(v) for k, v in data.get("accepted_per_pos", {}).items()}
        return cls(totals=dict(data.get("totals", {})), accepted_per_pos=per_pos)


def parse_counters(text: str) -> CounterSnapshot:
    # prometheus_client costs a tenth of a second to import: only when a /metrics page is parsed.
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = defaultdict(float)
    per_pos: dict[int, float] = defaultdict(float)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _COUNTERS:
                    totals[sample.name] += sample.value
                elif sample.name == ACCEPTED_PER_POS and "position" in sample.labels:
                    per_pos[int(sample.labels["position"])] += sample.value
    except ValueError as exc:
        raise MetricsParseError(f"/metrics is not Prometheus text ({exc}); is this a vLLM server?") from None
    return CounterSnapshot(totals=dict(totals), accepted_per_pos=dict(sorted(per_pos.items())))


@dataclass(frozen=True)
class SpecDecodeStats:
    """Acceptance over one interval (after − before), vLLM's own definitions:
    acceptance length = 1 + accepted / drafts, acceptance rate = accepted / draft tokens."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    generation_tokens: float | None
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position_acceptance: list[float]

    def to_json(self) -> JSONObject:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "generation_tokens": self.generation_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_length": self.acceptance_length,
            "per_position_acceptance": list(self.per_position_acceptance),
        }


def step_token_limit(before: CounterSnapshot, after: CounterSnapshot) -> int | None:
    """The most tokens one engine step makes for a request over the window: K+1 with K the drafts'
    tokens per drafting step, 1 for a vLLM server that counts generated tokens and drafts none (no
    speculative decoding), None where /metrics cannot say (not vLLM, no generation in the window)."""
    stats = spec_decode_delta(before, after)
    if stats is not None and stats.num_drafts > 0:
        return 1 + round(stats.num_draft_tokens / stats.num_drafts)
    generated = after.totals.get(GENERATION_TOKENS, 0.0) - before.totals.get(GENERATION_TOKENS, 0.0)
    return 1 if stats is None and generated > 0 else None


def spec_decode_delta(before: CounterSnapshot, after: CounterSnapshot) -> SpecDecodeStats | None:
    """None when the server has no spec-decode counters at all (K=0, or not vLLM)."""
    if DRAFTS not in after.totals:
        return None

    def delta(name: str) -> float:
        return after.totals.get(name, 0.0) - before.totals.get(name, 0.0)

    drafts, draft_tokens, accepted = delta(DRAFTS), delta(DRAFT_TOKENS), delta(ACCEPTED)
    per_pos = (
        [
            (after.accepted_per_pos.get(pos, 0.0) - before.accepted_per_pos.get(pos, 0.0)) / drafts
            for pos in sorted(after.accepted_per_pos)
        ]
        if drafts > 0
        else []
    )
    return SpecDecodeStats(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        generation_tokens=delta(GENERATION_TOKENS) if GENERATION_TOKENS in after.totals else None,
        acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        acceptance_length=1.0 + accepted / drafts if drafts > 0 else None,
        per_position_acceptance=per_pos,
    )


# How far the stream's tokens per decode chunk may sit from a forced acceptance length before the
# report says the server did not force it: the last chunk of a capped reply and a first chunk that
# carries one token pull the mean a few per cent under the forced figure.
FORCED_TOLERANCE = 0.10


def speculation_text(
    config: Mapping[str, Any] | None, concurrency: int | None, measured: float | None = None
) -> str:
    """How a variant's server speculates, in words, from its speculative config (None: launched
    without the argument, which for vLLM is speculation off). A dynamic schedule (vLLM's
    num_speculative_tokens_per_batch_size, [start, end, K] triples) names the K in force at the run's
    concurrency, so "K=0 by the schedule" is never read as speculation off: they are different
    baselines (vllm-ascend #16638 measured the first 2.5x slower a step)."""
    if config is None:  # a fact about the arguments: a server that is not vLLM may speculate anyway
        return "no --speculative-config in its launch arguments"
    method = config.get("method") or "speculative"
    schedule = config.get("num_speculative_tokens_per_batch_size")
    text = f"{method}, K={config.get('num_speculative_tokens', '?')}"
    if isinstance(schedule, list) and schedule:
        steps = [s for s in schedule if isinstance(s, list | tuple) and len(s) == 3]
        spans = ", ".join(f"batch {lo}-{hi}: K={k}" for lo, hi, k in steps)
        text = f"{method}, K by batch size ({spans})"
        at = [k for lo, hi, k in steps if concurrency is not None and lo <= concurrency <= hi]
        if at:
            text += f"; at this run's concurrency {concurrency}: K={at[0]}"
            if at[0] == 0:
                text += " by the schedule (drafting on, not speculation off)"
    if config.get("rejection_sample_method") == "synthetic":
        text += "; acceptance forced (synthetic): speed is a projection"
    return text + _measured_words(config, measured)


def _measured_words(config: Mapping[str, Any], measured: float | None) -> str:
    """The stream's acceptance (tokens per decode chunk, `measured`) beside what the config says it
    should be: the forced length of a synthetic run (a server that did not force it ran another
    experiment), else the K+1 a step can carry at most (above it, chunks bundle steps: stream_bundled)."""
    if measured is None:
        return ""
    text = f"; the stream measured {measured:.2f} tokens a decode chunk"
    forced, k = config.get("synthetic_acceptance_length"), config.get("num_speculative_tokens")
    if (
        config.get("rejection_sample_method") == "synthetic"
        and isinstance(forced, int | float)
        and forced > 0
    ):
        off = measured / forced - 1
        text += f" against the {forced:g} forced"
        if abs(off) > FORCED_TOLERANCE:
            text += f" ({off:+.0%}: not the acceptance it was told to force)"
    elif isinstance(k, int) and not isinstance(k, bool) and k > 0:
        text += f", of at most {k + 1} a step at K={k}"
    return text
