"""Other tools' result files, mapped onto itlaudit's metric names so they can sit beside a run.

The point is to explain a disagreement, not to re-rank tools: `vllm bench serve` calls the gap between
SSE chunks "ITL", AIPerf calls (latency − TTFT) / (OSL − 1) "ITL" (itlaudit's TPOT) and the chunk gap
"ICL". Each figure is filed under what it actually measures, with the tool's own name kept beside it.
Pure: takes the already-parsed JSON, returns figures; reading the file is the caller's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from itlaudit.analysis.metrics import summarize
from itlaudit.errors import RecordsError
from itlaudit.model.jsonvalue import JSONMapping

VLLM_BENCH = "vllm bench serve"
AIPERF = "AIPerf"

Stats = dict[str, float | int | None]


@dataclass(frozen=True)
class ImportedBenchmark:
    """One foreign result file. `figures` maps an itlaudit summary key (itl_ms, chunk_itl_ms, ...) to
    stats shaped like a summary.json block (mean/p50/p90/p99, any may be None); `names` says what the
    tool calls that figure; `notes` say why it can differ from itlaudit's."""

    tool: str
    source: str
    model: str | None
    requests: int | None
    figures: dict[str, Stats]
    names: dict[str, str]
    notes: list[str] = field(default_factory=list)


def parse_import(data: Any, source: str) -> ImportedBenchmark:
    """Recognise the tool from its keys; anything else is a one-line error naming what was expected."""
    if isinstance(data, dict) and ("itls" in data or "mean_itl_ms" in data or "mean_tpot_ms" in data):
        return _vllm_bench(data, source)
    if isinstance(data, dict) and any(isinstance(data.get(k), dict) for k in _AIPERF_KEYS):
        return _aiperf(data, source)
    raise RecordsError(
        f"{source}: not a `vllm bench serve --save-result` JSON (keys itls, mean_itl_ms, ...) nor an "
        "AIPerf profile_export_aiperf.json (keys inter_token_latency, time_to_first_token, ...)"
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --- vllm bench serve ---------------------------------------------------------------------------------

# itlaudit key → the `<stat>_<name>_ms` stem vllm bench serve writes (serve.py process_one_metric).
_VLLM_REPORTED = {"chunk_itl_ms": "itl", "tpot_ms": "tpot", "ttft_ms": "ttft", "e2e_ms": "e2el"}


def _vllm_stats(data: JSONMapping, stem: str) -> Stats:
    return {
        "mean": _number(data.get(f"mean_{stem}_ms")),
        "p50": _number(data.get(f"median_{stem}_ms", data.get(f"p50_{stem}_ms"))),
        "p90": _number(data.get(f"p90_{stem}_ms")),
        "p99": _number(data.get(f"p99_{stem}_ms")),
    }


def _per_request(data: JSONMapping) -> dict[str, list[float | None]]:
    """Token-true figures recomputed from the tool's own per-request lists (--save-detailed).

    vllm bench keeps each request's chunk gaps (`itls`, seconds) and the server's output token count
    (`output_lens`), but not how many tokens each chunk held, so token ITL here assumes the first chunk
    carried one token: (sum of gaps) / (output_len − 1). A failed request (output_len 0) is skipped.
    """
    itls, lens = data.get("itls"), data.get("output_lens")
    out: dict[str, list[float | None]] = {"itl_ms": [], "tokens_per_chunk": [], "completion_tokens": []}
    if not isinstance(itls, list) or not isinstance(lens, list):
        return out
    for gaps, tokens in zip(itls, lens, strict=False):
        if not isinstance(gaps, list) or not isinstance(tokens, int) or tokens <= 0:
            continue
        out["completion_tokens"].append(float(tokens))
        out["tokens_per_chunk"].append(tokens / (len(gaps) + 1))
        out["itl_ms"].append(1000.0 * sum(gaps) / (tokens - 1) if tokens > 1 and gaps else None)
    return out


def _vllm_bench(data: JSONMapping, source: str) -> ImportedBenchmark:
    figures = {key: _vllm_stats(data, stem) for key, stem in _VLLM_REPORTED.items()}
    names = {
        "chunk_itl_ms": "ITL (mean_itl_ms, median_itl_ms, …): every gap between SSE chunks, pooled",
        "tpot_ms": "TPOT (mean_tpot_ms, …): (latency − TTFT) / (output_len − 1)",
        "ttft_ms": "TTFT (mean_ttft_ms, …)",
        "e2e_ms": "E2EL (mean_e2el_ms, …)",
    }
    notes = [
        "vllm bench serve's ITL is the time between SSE chunks: under speculative decoding each chunk "
        "carries several tokens, so it is larger than the time per token by about the tokens per chunk."
    ]
    recomputed = _per_request(data)
    if recomputed["completion_tokens"]:
        for key, values in recomputed.items():
            figures[key] = summarize(values)
        names |= {
            "itl_ms": "(recomputed from its itls and output_lens: sum of gaps / (output_len − 1))",
            "tokens_per_chunk": "(recomputed: output_len / chunks)",
            "completion_tokens": "output_lens",
        }
    else:
        notes.append(
            "No per-request lists in the file (run with --save-result --save-detailed) to recompute from."
        )
    acceptance = _number(data.get("spec_decode_acceptance_length"))
    if acceptance is not None:
        notes.append(f"Its /metrics acceptance length: {acceptance:.2f} tokens per step.")
    return ImportedBenchmark(
        tool=VLLM_BENCH,
        source=source,
        model=model if isinstance(model := data.get("model_id"), str) else None,
        requests=completed if isinstance(completed := data.get("completed"), int) else None,
        figures=figures,
        names=names,
        notes=notes,
    )


# --- AIPerf profile_export_aiperf.json -------------------------------------------------------------------

# itlaudit key → (AIPerf metric tags, newest first; what AIPerf calls it). Field names from AIPerf's docs
# (docs/tutorials/working-with-profile-exports.md, docs/metrics_reference.md); no AIPerf run here.
_AIPERF_METRICS: dict[str, tuple[Sequence[str], str]] = {
    "ttft_ms": (("time_to_first_token", "ttft"), "TTFT (time_to_first_token)"),
    "tpot_ms": (
        ("inter_token_latency",),
        "ITL (inter_token_latency): (request_latency − TTFT) / (OSL − 1), OSL tokenizer-counted",
    ),
    "chunk_itl_ms": (("inter_chunk_latency",), "ICL (inter_chunk_latency): gaps between SSE chunks"),
    "e2e_ms": (("request_latency",), "request_latency"),
    "completion_tokens": (("output_sequence_length",), "OSL (output_sequence_length)"),
    "decode_tokens_per_s": (
        ("output_token_throughput_per_user",),
        "output_token_throughput_per_user: 1 / its ITL",
    ),
}
_AIPERF_KEYS = tuple(tag for tags, _ in _AIPERF_METRICS.values() for tag in tags)
_TO_MS = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 1e-3, "ns": 1e-6}


def _aiperf_stats(block: JSONMapping) -> Stats:
    unit = str(block.get("unit", "")).lower()
    scale = _TO_MS.get(unit, 1.0)  # token counts and tokens/s carry their own units: leave them be

    def get(key: str) -> float | None:
        value = _number(block.get(key))
        return value * scale if value is not None else None

    return {"mean": get("avg"), "p50": get("p50"), "p90": get("p90"), "p99": get("p99")}


def _aiperf(data: JSONMapping, source: str) -> ImportedBenchmark:
    figures: dict[str, Stats] = {}
    names: dict[str, str] = {}
    for key, (tags, name) in _AIPERF_METRICS.items():
        block = next((b for t in tags if isinstance(b := data.get(t), dict)), None)
        if block is not None:
            figures[key], names[key] = _aiperf_stats(block), name
    config = data.get("input_config")
    config = config if isinstance(config, dict) else {}
    endpoint = config.get("endpoint")
    endpoint = endpoint if isinstance(endpoint, dict) else {}
    models = endpoint.get("model_names")
    request_count = data.get("request_count")
    count = _number(request_count.get("avg")) if isinstance(request_count, dict) else None
    notes = [
        "AIPerf's ITL is itlaudit's TPOT (it includes the last chunk's gap and counts tokens with its "
        "tokenizer); its ICL is chunk ITL. The file holds aggregates only, so token ITL cannot be "
        "recomputed from it."
    ]
    return ImportedBenchmark(
        tool=AIPERF,
        source=source,
        model=models[0] if isinstance(models, list) and models and isinstance(models[0], str) else None,
        requests=int(count) if count is not None else None,
        figures=figures,
        names=names,
        notes=notes,
    )
