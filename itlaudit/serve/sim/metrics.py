"""The simulator's /metrics: vLLM's Prometheus counter names, labels and spec-decode counters."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from itlaudit.serve.sim.engine import Engine

__all__ = ["MetricsCollector"]


class MetricsCollector(Collector):
    """Renders vLLM's /metrics names; labels sorted as in real vLLM's multiprocess output."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[CounterMetricFamily]:
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
