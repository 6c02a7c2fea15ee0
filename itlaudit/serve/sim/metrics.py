"""The simulator's /metrics: vLLM's Prometheus names and labels, its token, request and spec-decode
counters, and the scheduler's gauges (running, waiting, KV usage), preemptions, prefix-cache counters
and queue-time histogram, which move with the load (serve/sim/load.py)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from itlaudit.serve.sim.engine import Engine
from itlaudit.serve.sim.load import QUEUE_BUCKETS_S


class MetricsCollector(Collector):
    """Renders vLLM's /metrics names; labels sorted as in real vLLM's multiprocess output."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        engine, cfg = self.engine, self.engine.config
        base = {"engine": "0", "model_name": cfg.model}

        def counter(name: str, doc: str, samples: list[tuple[dict[str, str], int]]) -> CounterMetricFamily:
            labels = sorted(samples[0][0])
            family = CounterMetricFamily(name, doc, labels=labels)
            for extra, value in samples:
                family.add_metric([extra[k] for k in labels], float(value), created=engine.started)
            return family

        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [(base, engine.prompt_tokens)]
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            [(base, engine.generation_tokens)],
        )
        load = engine.load

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=sorted(base))
            family.add_metric([base[k] for k in sorted(base)], value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in model execution batches.", load.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", load.waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", load.kv_usage)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption.", [(base, load.preemptions)])
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(base, load.prefix_queries)],
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(base, load.prefix_hits)],
        )
        queue = HistogramMetricFamily(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels=sorted(base),
        )
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, QUEUE_BUCKETS_S), "+Inf"], load.queue_counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        queue.add_metric([base[k] for k in sorted(base)], buckets, load.queue_sum_s)
        yield queue
        yield counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [({**base, "finished_reason": r}, n) for r, n in engine.finished.items()],
        )
        if not cfg.num_speculative_tokens:
            return  # vLLM registers the spec-decode counters only when speculative decoding is on.
        spec = engine.spec
        yield counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(base, spec.num_drafts)]
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(base, spec.num_draft_tokens)]
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            [(base, spec.num_accepted_tokens)],
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [({**base, "position": str(pos)}, n) for pos, n in enumerate(spec.accepted_per_pos)],
        )
