"""The simulator's scheduler state as vLLM's gauges show it: running and waiting requests, KV-cache
usage, preemptions and prefix-cache hits, moving with the load a run puts on it.

Only what a /metrics sampler needs to see move is modelled. Requests beyond `max_num_seqs` really wait
(a seat is awaited before prefill, as vLLM's scheduler holds them in its waiting queue); KV usage is
the tokens of the running requests over `kv_cache_tokens`; a step that would overfill the cache counts
a preemption (the request keeps running: the count is what moves, not the timing); the prefix cache
remembers every full 16-token block of every prompt it has seen.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import Any

from itlaudit.model.jsonvalue import JSONObject, JSONValue

BLOCK_TOKENS = 16  # vLLM's default KV block size: prefix hits come in whole blocks
# vllm:request_queue_time_seconds' buckets (vLLM 0.32's request_latency_buckets), +Inf last.
QUEUE_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class Load:
    """Shared by every request of one engine; the server admits and releases, the engine grows."""

    def __init__(self, max_num_seqs: int | None, kv_cache_tokens: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens
        self.running = 0
        self.waiting = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._held: dict[int, int] = {}  # id(job) -> KV tokens it holds
        self._total = 0  # their sum, kept as they move: grow() runs on every step
        self._blocks: set[int] = set()
        self._seat: asyncio.Condition | None = None
        self.queue_counts = [0] * (len(QUEUE_BUCKETS_S) + 1)  # per bucket (not cumulative), +Inf last
        self.queue_sum_s = 0.0

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache the running requests hold, as vllm:kv_cache_usage_perc (0..1)."""
        return min(1.0, self._total / self.kv_cache_tokens)

    async def admit(self, jobs: list[Any]) -> None:
        """Wait for a seat for these rows (none needed without max_num_seqs), then hold their prompts
        in the cache and look them up in the prefix cache."""
        arrived = time.monotonic()
        if self.max_num_seqs is not None:
            if self._seat is None:
                self._seat = asyncio.Condition()
            limit = self.max_num_seqs
            async with self._seat:
                self.waiting += len(jobs)
                try:
                    # Rows beyond the limit wait; a multi-row request larger than it runs alone.
                    await self._seat.wait_for(lambda: self.running == 0 or self.running + len(jobs) <= limit)
                finally:
                    self.waiting -= len(jobs)
        waited = time.monotonic() - arrived
        self.queue_counts[bisect.bisect_left(QUEUE_BUCKETS_S, waited)] += len(jobs)
        self.queue_sum_s += waited * len(jobs)
        self.running += len(jobs)
        for job in jobs:
            prompt = list(job.prompt_token_ids)
            self._held[id(job)] = len(prompt)
            self._total += len(prompt)
            self._look_up(prompt)

    async def release(self, jobs: list[Any]) -> None:
        self.running -= len(jobs)
        for job in jobs:
            self._total -= self._held.pop(id(job), 0)
        if self._seat is not None:
            async with self._seat:
                self._seat.notify_all()

    def grow(self, job: Any, tokens: int) -> None:
        """A step of `job` added `tokens` to the cache; one that overfills it counts a preemption."""
        if id(job) not in self._held:
            return  # a row run outside the server's admission (an engine driven directly)
        if self._total + tokens > self.kv_cache_tokens:
            self.preemptions += 1
        self._held[id(job)] += tokens
        self._total += tokens

    def _look_up(self, prompt: list[int]) -> None:
        """Count the prompt's tokens as queried and its leading blocks seen before as hit, then
        remember its blocks (a block's key chains every block before it, as vLLM's block hashes do)."""
        self.prefix_queries += len(prompt)
        key, hit, matching = 0, 0, True
        for start in range(0, len(prompt) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            key = hash((key, tuple(prompt[start : start + BLOCK_TOKENS])))
            if matching and key in self._blocks:
                hit += BLOCK_TOKENS
            else:
                matching = False
                self._blocks.add(key)
        self.prefix_hits += hit


@dataclass
class RequestSpecMetrics:
    """One request's acceptance, as vLLM 0.32's `--per-request-spec-decode-metrics summary` reports it
    on the final usage chunk (`metrics.speculative_decoding`; vllm/v1/metrics/stats.py)."""

    num_spec_tokens: int
    histogram: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        self.histogram = self.histogram or [0] * (self.num_spec_tokens + 1)

    def observe(self, num_draft_tokens: int, accepted: int) -> None:
        self.histogram[accepted] += 1
        self.num_draft_tokens += num_draft_tokens

    def to_dict(self, *, lie: bool = False) -> JSONObject:
        """vLLM's payload. `lie` (a fault) reports every draft accepted, whatever the stream carried."""
        histogram = list(self.histogram)
        if lie:
            histogram = [0] * self.num_spec_tokens + [sum(histogram)]
        shown: list[JSONValue] = list(histogram)
        steps = sum(histogram)
        accepted = sum(j * count for j, count in enumerate(histogram))
        return {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "acceptance_histogram": shown,
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
        }
