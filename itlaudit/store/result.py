"""`--save-result FILE`: a finished run as vllm bench serve's result JSON, one file per variant.

Dashboards that ingest `vllm bench serve --save-result` files read these unchanged: every key vllm
bench writes that itlaudit can compute has vllm bench's name and vllm bench's meaning (vllm
0.32's benchmarks/serve.py). In particular `*_itl_ms` is vllm bench's ITL, pooled over chunk gaps:
under speculative decoding a per-chunk figure. itlaudit's own figures stand beside them under names
vllm bench does not use: the token-true ITL (`mean_token_itl_ms`, `p99_token_itl_ms`, ...), tokens
per decode chunk, the findings and whether the variant may be compared at all.

vllm bench's per-request arrays (`PER_REQUEST_ARRAYS`) are there with --save-detailed, as in vllm
bench (requests.jsonl holds them in full either way; `latencies` and `queue_times`, which it keeps
without, are always there); `request_goodput` is null as in a vllm bench run without --goodput. The
percentiles are p50, p90, p99 and those --metric-percentiles chose. --append-result adds the result to
the file as one more JSON line, as vllm bench does. The spec-decode keys (`spec_decode_*`, from the
server's /metrics around the variant, acceptance rate in percent as vllm bench writes it) are there
when `itlaudit compare` made the run: `run` reads no /metrics.

The file is built from the run folder alone (summary.json, meta.json, compare.json when present), so
it can be written again for any past run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.metrics import decode_gaps, request_metrics
from itlaudit.analysis.specdecode import SpecDecodeStats
from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import variant_validity
from itlaudit.errors import ItlauditError
from itlaudit.model.codes import TRUNCATION_CODES
from itlaudit.model.formats import FORMAT, FORMAT_KEY
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.meta import Meta, WorkloadMeta
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.run_context import is_simulator, server_build, variant_meta
from itlaudit.model.vocabulary import Endpoint
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import load_records
from itlaudit.store.rundir import REQUESTS_FILE, write_json

# In a --save-result file name, the place for vllm bench serve's own default name (bench_flags).
VLLM_NAME = "{vllm_name}"
# vllm bench serve's per-request arrays written only with --save-detailed (`latencies` and
# `queue_times`, which it keeps without, are always written).
PER_REQUEST_ARRAYS = frozenset(
    {"input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors"}
)
# vllm bench serve's --backend for each itlaudit endpoint (its result's `backend`/`endpoint_type`).
BACKENDS: dict[str, str] = {Endpoint.COMPLETIONS: "openai", Endpoint.CHAT: "openai-chat"}  # by endpoint name
# vllm bench's metric name → summary.json's block["benchmark"] key; `itl` is vllm bench's chunk ITL.
VLLM_STATISTICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "chunk_itl_ms", "e2el": "e2el_ms"}
# summary.json's block["benchmark"] keys that vllm bench writes under the same name, in its order
# around `request_goodput` (null, as in a vllm bench run without --goodput).
_BEFORE_GOODPUT = ("completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput")
_AFTER_GOODPUT = (
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)


def _figures(bench: JSONObject, key: str) -> JSONObject:
    """One distribution among a block's run-level figures (vllm bench's names), empty where absent."""
    found = bench.get(key)
    return found if isinstance(found, dict) else {}


def _statistics(name: str, figures: JSONObject) -> JSONObject:
    """vllm bench's keys for one metric: mean_, median_, std_, then one per percentile summary.json
    holds (p50, p90, p99 and those --metric-percentiles chose: p95_, p99.9_)."""
    out: JSONObject = {
        f"{stat}_{name}_ms": figures.get(key) for stat, key in (("mean", "mean"), ("median", "p50"))
    }
    out[f"std_{name}_ms"] = figures.get("std")
    out.update({f"{key}_{name}_ms": value for key, value in figures.items() if _PERCENTILE.match(key)})
    return out


def _spec_decode(stats: SpecDecodeStats | None) -> JSONObject:
    """compare.json's /metrics acceptance as vllm bench writes it (rate in percent, counts as ints);
    nothing when the server drafted nothing, as vllm bench leaves the keys out."""
    if stats is None or not stats.num_draft_tokens:
        return {}
    rate = stats.acceptance_rate
    return {
        "spec_decode_acceptance_rate": None if rate is None else rate * 100,
        "spec_decode_acceptance_length": stats.acceptance_length,
        "spec_decode_num_drafts": int(stats.num_drafts),
        "spec_decode_draft_tokens": int(stats.num_draft_tokens),
        "spec_decode_accepted_tokens": int(stats.num_accepted_tokens),
        "spec_decode_per_position_acceptance_rates": list(stats.per_position_acceptance),
    }


def result_json(
    summary: RunSummary,
    meta: Meta,
    variant: str,
    compare: CompareResult | None = None,
    records: Sequence[RequestRecord] = (),
    *,
    detailed: bool = False,
) -> JSONObject:
    """One variant's result, in vllm bench serve's key order: setup, metadata, traffic, figures.
    `compare` is compare.json, when `itlaudit compare` made the run; `records` the variant's
    measured requests, for the two per-request arrays vllm bench keeps without --save-detailed, and
    with `detailed` (--save-detailed) the others."""
    block = summary.variants[variant]
    bench: JSONObject = msgspec.to_builtins(block.benchmark)  # as JSON: the result copies its values
    workload, info, version = variant_meta(meta, variant)
    started = meta.started_at_unix
    # a pasted line's --backend as given, else the one vllm bench would need for the endpoint
    backend = meta.backend or BACKENDS.get(str(meta.endpoint), str(meta.endpoint))
    rate = workload.get("request_rate")
    validity = variant_validity(summary, variant)
    findings = block.findings
    result: JSONObject = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) if started else None,
        "endpoint_type": backend,  # vllm bench writes its --backend in both
        "backend": backend,
        "label": meta.label,
        "model_id": block.model or workload.get("model"),
        "tokenizer_id": block.model or workload.get("model"),  # the server's own: usage counts
        "num_prompts": workload.get("num_prompts", block.requests),
        # vllm bench writes --metadata KEY=VALUE pairs as top-level keys; its figures win a clash.
        **meta.metadata,
        "request_rate": "inf" if rate is None else rate,
        "burstiness": workload.get("burstiness", 1.0),
        "max_concurrency": _cap(workload),
        "duration": bench.get("duration_s"),
        **{key: bench.get(key) for key in _BEFORE_GOODPUT},
        "request_goodput": bench.get("request_goodput"),  # null without --goodput, as vllm bench's
        **{key: bench.get(key) for key in _AFTER_GOODPUT},
        "rtfx": 0.0,  # vllm bench's audio input duration / duration: no audio here
        **_kept_arrays(records),
        **(_detailed_arrays(records) if detailed else {}),
    }
    compared = compare.variants.get(variant) if compare is not None else None
    result.update(_spec_decode(compared.spec_decode if compared is not None else None))
    for name, key in VLLM_STATISTICS.items():
        result.update(_statistics(name, _figures(bench, key)))
    # itlaudit's own keys, under names vllm bench does not use.
    result.update(_statistics("token_itl", _figures(bench, "token_itl_ms")))
    if "ttfa_ms" in bench:  # a thinking model's: mean_ttfa_ms, ... beside vllm bench's TTFT keys
        result.update(_statistics("ttfa", _figures(bench, "ttfa_ms")))
        for channel in ("reasoning", "answer"):
            if f"{channel}_tokens" in bench:
                result[f"total_{channel}_tokens"] = bench[f"{channel}_tokens"]
                result.update(_statistics(f"{channel}_itl", _figures(bench, f"{channel}_itl_ms")))
    result.update(
        {
            "tokens_per_decode_chunk": bench.get("tokens_per_decode_chunk"),
            "decode_chunks": bench.get("decode_chunks"),
            "input_tokens_unknown": bench.get("input_tokens_unknown"),
            "truncation_findings": {code: findings[code] for code in TRUNCATION_CODES if findings.get(code)},
            "findings": dict(findings),
            "comparable": validity.comparable,
            "not_comparable_reason": validity.reason,
            "variant": variant,
            "base_url": info.url,
            "server_build": server_build(version),
            "simulated": is_simulator(version),
            "token_source": dict(block.token_source),
            "stamp": dict(block.stamp),
            "itlaudit_version": meta.itlaudit_version,
            "command_line": meta.command_line,
            FORMAT_KEY: FORMAT,  # vllm bench writes no `format`; after --metadata, so it wins a clash
        }
    )
    result.update(_server_figures(summary.server.get(variant)))
    return result


# The GPU energy keys (analysis.server_metrics.gpu_energy), where NVML gave it: vllm bench 0.32 writes
# none, and its energy PRs (#38647, #56354) are not merged, so the names are summary.json's own. The
# memory-bandwidth floor's (analysis.roofline), where the run named the model's config, likewise.
_SERVER_KEYS = {
    "gpu_energy_j": (
        "gpu_energy_j",
        "gpu_joules_per_output_token",
        "output_tokens_per_joule",
        "gpu_energy_per_gpu_j",
        "gpu_energy_source",
    ),
    "floor_ms": (
        "floor_ms",
        "floor_share",
        "floor_bytes_per_step",
        "floor_bandwidth_gbps",
        "floor_bandwidth_source",
        "floor_device",
        "floor_batch",
        "floor_context_tokens",
    ),
}


def _server_figures(server: Mapping[str, Any] | None) -> JSONObject:
    if not isinstance(server, Mapping):
        return {}
    return {
        key: server.get(key)
        for present, keys in _SERVER_KEYS.items()
        if server.get(present) is not None
        for key in keys
    }


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PERCENTILE = re.compile(r"^p\d+(\.\d+)?$")  # a distribution's percentile key: p50, p99.9


def vllm_file_name(meta: Meta, summary: RunSummary, variant: str) -> str:
    """vllm bench serve's default result name without its .json (compute_result_filename in vLLM
    0.32's benchmarks/serve.py): `{label or backend}-{rate}qps[-concurrency{N}]-{model}-{date}`, the
    model's last path part, the date the run started in local time."""
    workload = variant_meta(meta, variant).workload
    rate = workload.get("request_rate")
    concurrency = _cap(workload)
    label = meta.label or meta.backend or BACKENDS.get(str(meta.endpoint), "openai")
    model = str(summary.variants[variant].model or "model").split("/")[-1]
    started = time.localtime(meta.started_at_unix or time.time())
    parts = [
        f"{label}-{float(rate) if rate is not None else float('inf')}qps",
        f"-concurrency{concurrency}" if concurrency is not None else "",
        f"-{model}-{time.strftime('%Y%m%d-%H%M%S', started)}",
    ]
    return "".join(parts)


def _cap(workload: WorkloadMeta) -> int | None:
    """vllm bench's max_concurrency: None where nothing caps the open requests (no --max-concurrency:
    itlaudit's closed loop of every request at once, or an open loop's cap of all of them), as vllm
    bench writes it; a cap at or above every request sent cannot bind, so it reads the same."""
    cap = workload.get("max_concurrency")
    sent = (workload.get("num_prompts") or 0) + (workload.get("num_warmups") or 0)
    return None if cap is None or (sent and cap >= sent) else int(cap)


def _kept_arrays(records: Sequence[RequestRecord]) -> JSONObject:
    """`latencies` and `queue_times`, seconds, one per request in dispatch order, which vllm bench
    0.32 writes even without --save-detailed: a request's end-to-end latency (0.0 for one that
    failed), and how long it waited in the client after its arrival (the schedule's due time, or the
    start in a closed loop) before it went out. None where a record lacks the times."""
    ordered = sorted(records, key=lambda r: r.sent_offset_ms if r.sent_offset_ms is not None else math.inf)
    if not ordered:
        return {}
    return {
        "latencies": [(r.e2e_ms or 0.0) / 1000 if r.status == Status.OK else 0.0 for r in ordered],
        "queue_times": [
            (r.sent_offset_ms - (r.scheduled_ms or 0.0)) / 1000 if r.sent_offset_ms is not None else None
            for r in ordered
        ],
    }


def _detailed_arrays(records: Sequence[RequestRecord]) -> JSONObject:
    """vllm bench's --save-detailed arrays, one entry per request in dispatch order, in its units
    (seconds) and with its values for a failed request (0 tokens, TTFT 0.0, no gaps, its error):
    prompt and output tokens (the server's usage), TTFT, the chunk gaps (vllm bench's ITL, per chunk),
    the send time on the capture clock, the text and the error ("" for none)."""
    ordered = sorted(records, key=lambda r: r.sent_offset_ms if r.sent_offset_ms is not None else math.inf)
    ok = [r.status == Status.OK for r in ordered]
    return {
        "input_lens": [r.prompt_tokens or 0 for r in ordered],
        "output_lens": [
            (r.completion_tokens or 0) if good else 0 for r, good in zip(ordered, ok, strict=True)
        ],
        "ttfts": [_ttft_s(r) if good else 0.0 for r, good in zip(ordered, ok, strict=True)],
        "itls": [
            [float(g) / 1000 for g in decode_gaps(r)[0]] if good else []
            for r, good in zip(ordered, ok, strict=True)
        ],
        "start_times": [
            r.sent_monotonic_ns / 1e9 if r.sent_monotonic_ns is not None else None for r in ordered
        ],
        "generated_texts": [r.text for r in ordered],
        "errors": ["" if good else (r.error or str(r.status)) for r, good in zip(ordered, ok, strict=True)],
    }


def _ttft_s(record: RequestRecord) -> float:
    """The first content chunk's arrival, seconds after the send (0.0 for a stream without one)."""
    ttft = request_metrics(record).ttft_ms
    return ttft / 1000 if ttft is not None else 0.0


def result_paths(path: Path, variants: list[str]) -> dict[str, Path]:
    """FILE for a single variant; `<stem>-<variant><suffix>` beside it for each of several."""
    if len(variants) == 1:
        return {variants[0]: path}
    return {v: path.with_name(f"{path.stem}-{_UNSAFE.sub('_', v)}{path.suffix}") for v in variants}


def save_result(path: Path, run_dir: Path, *, detailed: bool = False, append: bool = False) -> list[Path]:
    """Write the vllm bench style result file(s) of a finished run folder; returns what was written.
    `detailed`: --save-detailed's per-request arrays; `append`: --append-result, the result added to
    what the file holds as one more JSON line (a newline between), as vllm bench appends it."""
    run = RunFiles(run_dir)
    try:
        summary = run.summary
        meta = run.meta_file
        compare = run.compare
    except (OSError, ValueError) as exc:
        raise ItlauditError(f"--save-result: cannot read the run folder {run_dir} ({exc})") from None
    names = list(summary.variants)
    if not names:
        raise ItlauditError(f"--save-result: {run_dir} recorded no requests, so there is no result")
    try:
        records = [r for r in load_records(run_dir / REQUESTS_FILE) if not r.warmup]
    except (OSError, ValueError) as exc:
        raise ItlauditError(f"--save-result: cannot read {run_dir / REQUESTS_FILE} ({exc})") from None
    written = []
    for variant, target in result_paths(path, names).items():
        if VLLM_NAME in target.name:
            target = target.with_name(target.name.replace(VLLM_NAME, vllm_file_name(meta, summary, variant)))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            mine = [r for r in records if r.variant == variant]
            result = result_json(summary, meta, variant, compare, mine, detailed=detailed)
            if append:
                with target.open("a+", encoding="utf-8") as file:
                    if file.tell():
                        file.write("\n")
                    json.dump(result, file, ensure_ascii=False)
            else:
                write_json(target, result)
        except OSError as exc:
            raise ItlauditError(f"--save-result {target}: {exc.strerror or exc}") from None
        written.append(target)
    return written
