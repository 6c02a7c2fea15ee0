"""Figures a workload past the synthetic brings (pure): the server's prefix-cache hit rate over a
variant's window, from vLLM's /metrics counters.

vLLM counts prompt tokens looked up in its prefix cache (`vllm:prefix_cache_queries`) and those found
(`vllm:prefix_cache_hits`); their ratio over the measured window is the hit rate a shared-prefix
workload (`prefix_repetition`, a trace's hashed blocks, multi-turn history) is meant to exercise. A
server without the counters (the simulator, a server with prefix caching off) has no rate: None, not 0.
"""

from __future__ import annotations

from itlaudit.analysis.specdecode import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, CounterSnapshot


def prefix_cache_delta(before: CounterSnapshot, after: CounterSnapshot) -> dict[str, float | None] | None:
    """Tokens queried and hit over the window and their ratio (None where nothing was queried);
    None when the server reports no prefix-cache counters."""
    if PREFIX_CACHE_QUERIES not in after.totals or PREFIX_CACHE_HITS not in after.totals:
        return None
    queries = after.totals[PREFIX_CACHE_QUERIES] - before.totals.get(PREFIX_CACHE_QUERIES, 0.0)
    hits = after.totals[PREFIX_CACHE_HITS] - before.totals.get(PREFIX_CACHE_HITS, 0.0)
    return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries > 0 else None}
