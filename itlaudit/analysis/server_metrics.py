"""A server's /metrics as a time series (pure: page text in, tidy rows and per-run figures out).

The sampler (telemetry/metrics_sampler.py) scrapes /metrics on a fixed period while a variant's measured
requests stream and writes one row per scrape to the run folder's server_metrics.jsonl: gauges as
values, counters as deltas since the scrape before, histograms as bucket deltas. Deltas make a row
readable on its own (what happened in that second) and make a counter reset (a restarted server) a
small dip, not a huge negative spike. Rows carry the capture's clock (time.monotonic_ns, the clock of
`sent_monotonic_ns` in every record) so they line up with the stream's chunks.

What a reader asks of a run is derived here: KV-cache usage p50 and max, preemptions, time in the
waiting queue, prefix-cache hit rate, and spec-decode acceptance per draft position over time.

SGLang's families (`sglang:*`, python/sglang/srt/metrics/collector.py) are read beside vLLM's where
they mean the same: `sglang:token_usage` (the KV pool's used share) as KV-cache usage,
`sglang:num_running_reqs` and `sglang:num_queue_reqs` as running and waiting. Two have no vLLM twin
and are figures of their own: `sglang:spec_accept_length` (its recent batches' mean acceptance length,
a gauge: SGLang exports no spec-decode counters) and `sglang:gen_throughput` (tokens/s). SGLang has no
preemption counter, queue-time histogram or prefix-cache counters (`sglang:cache_hit_rate` is a
rate, not counts): those figures stay None for it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from itlaudit.analysis.specdecode import ACCEPTED_PER_POS, DRAFTS, PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
from itlaudit.errors import MetricsParseError
from itlaudit.model.jsonvalue import JSONObject

SERVER_METRICS_FILE = "server_metrics.jsonl"
GPU_TELEMETRY_FILE = "gpu_telemetry.jsonl"  # telemetry/nvml.py's rows

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
QUEUE_TIME = "vllm:request_queue_time_seconds"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
SGLANG_KV_USAGE = "sglang:token_usage"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_GEN_THROUGHPUT = "sglang:gen_throughput"
# Each figure's families, vLLM's first: a server exports one dialect, so the first found is read.
_RUNNING = (RUNNING, SGLANG_RUNNING)
_WAITING = (WAITING, SGLANG_WAITING)
_KV_USAGE = (KV_USAGE, SGLANG_KV_USAGE)
# Labels every vLLM or SGLang series carries that say nothing about what was measured: summed (or
# averaged) over. SGLang's scheduler labels its series with its ranks and engine type.
_IDENTITY_LABELS = frozenset(
    {"engine", "model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank", "moe_ep_rank"}
)
# Gauges that are a share or a mean per engine (averaged over engines, not summed), besides `_perc`.
_AVERAGED = frozenset(
    {SGLANG_KV_USAGE, SGLANG_ACCEPT_LENGTH, "sglang:spec_accept_rate", "sglang:cache_hit_rate"}
)


@dataclass
class Scrape:
    """One /metrics page, summed over engines (data-parallel ranks): counters and gauges by series key
    (`name` or `name{label=value,...}`), histograms by name as cumulative bucket counts plus sum and
    count. A `_perc` gauge is a fraction per engine, so it is averaged, not summed."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[str, float]] = field(default_factory=dict)


def _key(name: str, labels: dict[str, str]) -> str:
    kept = sorted((k, v) for k, v in labels.items() if k not in _IDENTITY_LABELS)
    return name + ("{" + ",".join(f"{k}={v}" for k, v in kept) + "}" if kept else "")


def parse_scrape(text: str) -> Scrape:
    """A Prometheus text page into a Scrape; not Prometheus text is one MetricsParseError line."""
    from prometheus_client.parser import text_string_to_metric_families

    scrape = Scrape()
    engines: dict[str, int] = defaultdict(int)
    try:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_info"):
                continue  # configuration as labels (vllm:cache_config_info): constant, and long
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # when a series was created: a timestamp, not a figure
                # A counter whose TYPE line lacks `_total` parses as `unknown`: its samples still end so.
                if family.type in ("counter", "unknown") and sample.name.endswith("_total"):
                    key = _key(sample.name, sample.labels)
                    scrape.counters[key] = scrape.counters.get(key, 0.0) + sample.value
                elif family.type == "gauge":
                    key = _key(sample.name, sample.labels)
                    scrape.gauges[key] = scrape.gauges.get(key, 0.0) + sample.value
                    engines[key] += 1
                elif family.type == "histogram":
                    labels = {k: v for k, v in sample.labels.items() if k != "le"}
                    parts = scrape.histograms.setdefault(_key(family.name, labels), {})
                    suffix = sample.name[len(family.name) :]  # _bucket (by `le`), _sum or _count
                    part = sample.labels["le"] if suffix == "_bucket" else suffix.lstrip("_")
                    parts[part] = parts.get(part, 0.0) + sample.value
    except ValueError as exc:
        raise MetricsParseError(f"/metrics is not Prometheus text ({exc}); is this a vLLM server?") from None
    for key, count in engines.items():
        name = key.split("{")[0]
        if (name.endswith("_perc") or name in _AVERAGED) and count > 1:
            scrape.gauges[key] /= count
    return scrape


def _delta(now: float, before: float) -> float:
    """A counter's change (a series new since the scrape before started from 0); a counter that went
    down was reset (the server restarted): what it holds now is what happened since."""
    return now - before if now >= before else now


def delta_row(now: Scrape, before: Scrape | None) -> JSONObject:
    """One server_metrics.jsonl row's figures (the sampler adds its time and variant). The first
    scrape of a variant (before None) is its baseline: its gauges, and zero deltas."""
    counters: JSONObject
    histograms: JSONObject
    if before is None:
        counters = dict.fromkeys(now.counters, 0.0)
        histograms = {name: dict.fromkeys(parts, 0.0) for name, parts in now.histograms.items()}
    else:
        counters = {k: _delta(v, before.counters.get(k, 0.0)) for k, v in now.counters.items()}
        histograms = {
            name: {
                part: _delta(v, before.histograms.get(name, {}).get(part, 0.0)) for part, v in parts.items()
            }
            for name, parts in now.histograms.items()
        }
    return {"gauges": dict(now.gauges), "counters": counters, "histograms": histograms}


def _gauge_values(rows: list[dict[str, Any]], *names: str) -> list[float]:
    """The first of `names` any row carries (one figure's families in each dialect), over the rows."""
    for name in names:
        values = [float(r["gauges"][name]) for r in rows if name in r.get("gauges", {})]
        if values:
            return values
    return []


def _counter_total(rows: list[dict[str, Any]], name: str) -> float | None:
    seen = [float(r["counters"][name]) for r in rows if name in r.get("counters", {})]
    return sum(seen) if seen else None


def per_position_series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spec-decode acceptance per draft position in each interval that had drafts: accepted at
    position p over drafts (vLLM's definition), with the interval's end time."""
    out = []
    prefix = ACCEPTED_PER_POS + "{position="
    for row in rows:
        counters = row.get("counters", {})
        drafts = counters.get(DRAFTS)
        if not drafts:
            continue
        positions = sorted(
            (int(key[len(prefix) : -1]), value) for key, value in counters.items() if key.startswith(prefix)
        )
        out.append({"t_ns": row["t_ns"], "drafts": drafts, "acceptance": [v / drafts for _, v in positions]})
    return out


def summarize_series(rows: list[dict[str, Any]], window: tuple[int, int] | None = None) -> dict[str, Any]:
    """One variant's figures from its rows (error rows left out). A figure the server does not export
    is None: absent is not zero. `window` is the measured span (monotonic ns, first send to last
    end): a gauge (KV-cache usage, running and waiting requests) is read only from the samples taken
    inside it, since one taken before the first request or after the last says 0 of a window it never
    saw; with none inside, the gauges are None and `note` says why. Counters are deltas across the
    whole window, edges included."""
    rows = [r for r in rows if "t_ns" in r and "error" not in r]
    inside = rows if window is None else [r for r in rows if window[0] <= r["t_ns"] <= window[1]]
    kv = _gauge_values(inside, *_KV_USAGE)
    running, waiting = _gauge_values(inside, *_RUNNING), _gauge_values(inside, *_WAITING)
    # SGLang's gauge is 0 between speculating batches (and on a server that does not speculate)
    accept = [v for v in _gauge_values(inside, SGLANG_ACCEPT_LENGTH) if v > 0]
    throughput = _gauge_values(inside, SGLANG_GEN_THROUGHPUT)
    queries, hits = _counter_total(rows, PREFIX_CACHE_QUERIES), _counter_total(rows, PREFIX_CACHE_HITS)
    queue: dict[str, float] = defaultdict(float)
    for row in rows:
        for part, value in row.get("histograms", {}).get(QUEUE_TIME, {}).items():
            queue[part] += value
    spans = [r["t_ns"] for r in rows]
    note = {}
    if window is not None and rows and not inside:
        seconds = (window[1] - window[0]) / 1e9
        note["note"] = f"no /metrics sample in the {seconds:.1f} s window: lower --metrics-period"
    return {
        **note,
        "samples": len(rows),
        "samples_in_window": len(inside),
        "span_s": (max(spans) - min(spans)) / 1e9 if spans else 0.0,
        "kv_usage_p50": statistics.median(kv) if kv else None,
        "kv_usage_max": max(kv) if kv else None,
        "running_max": max(running) if running else None,
        "waiting_max": max(waiting) if waiting else None,
        "preemptions": _counter_total(rows, PREEMPTIONS),
        "queue_time_mean_s": queue["sum"] / queue["count"] if queue.get("count") else None,
        "queued_requests": queue.get("count"),
        "prefix_hit_rate": hits / queries if queries and hits is not None else None,
        "gauge_acceptance_length_p50": statistics.median(accept) if accept else None,
        "gen_throughput_p50": statistics.median(throughput) if throughput else None,
        "acceptance_per_position": per_position_series(rows),
    }


def gpu_figures(
    rows: list[dict[str, Any]], window: tuple[int, int] | None = None, output_tokens: int | None = None
) -> dict[str, Any]:
    """The watched GPUs over the window (all GPUs pooled): SM clock p50 and min, power and temperature
    max, memory used max, utilisation p50, and every throttle reason seen; the energy drawn over the
    measured `window` (gpu_energy) and, with the variant's `output_tokens`, per output token. Empty
    without rows."""
    gpus = [g for r in rows if "t_ns" in r and "error" not in r for g in r.get("gpus", {}).values()]
    if not gpus:
        return {}

    def values(key: str) -> list[float]:
        return [float(g[key]) for g in gpus if isinstance(g.get(key), int | float)]

    clock, util = values("sm_clock_mhz"), values("gpu_util_pct")
    power, temperature, memory = values("power_w"), values("temperature_c"), values("memory_used_mib")
    refused = {name for g in gpus for name in g.get("not_supported", [])}
    return {
        **gpu_energy(rows, window, output_tokens),
        # queries the GPU answers NOT_SUPPORTED (GB10: its framebuffer), so their figures are absent
        **({"gpu_not_supported": sorted(refused)} if refused else {}),
        "gpu_sm_clock_p50_mhz": statistics.median(clock) if clock else None,
        "gpu_sm_clock_min_mhz": min(clock) if clock else None,
        "gpu_power_max_w": max(power) if power else None,
        "gpu_temperature_max_c": max(temperature) if temperature else None,
        "gpu_memory_used_max_mib": max(memory) if memory else None,
        "gpu_util_p50_pct": statistics.median(util) if util else None,
        "gpu_throttle": sorted({reason for g in gpus for reason in g.get("throttle", [])}),
    }


# How a GPU's joules were found: NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since
# the driver loaded), or, where the GPU has none (pre-Volta, or a query it refuses), its power samples
# integrated (trapezoids between readings: a spike between two samples is missed).
ENERGY_COUNTER = "nvml_energy_counter"
ENERGY_POWER = "power_samples"


def _cumulative_joules(points: list[tuple[int, dict[str, Any]]]) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(t_ns, joules so far, source) for one GPU's readings: the counter where read twice, else the
    power samples' running integral; None with neither."""
    counter = [(t, float(g["energy_j"])) for t, g in points if isinstance(g.get("energy_j"), int | float)]
    if len(counter) >= 2:
        t, joules = (np.array(column, dtype=float) for column in zip(*counter, strict=True))
        return t, joules, ENERGY_COUNTER
    watts = [(t, float(g["power_w"])) for t, g in points if isinstance(g.get("power_w"), int | float)]
    if len(watts) < 2:
        return None
    t, power = (np.array(column, dtype=float) for column in zip(*watts, strict=True))
    steps = np.diff(t) / 1e9 * (power[1:] + power[:-1]) / 2
    return t, np.concatenate(([0.0], np.cumsum(steps))), ENERGY_POWER


def gpu_energy(
    rows: list[dict[str, Any]], window: tuple[int, int] | None = None, output_tokens: int | None = None
) -> dict[str, Any]:
    """Joules the watched GPUs drew over the measured `window` (monotonic ns; all the rows without
    one), per GPU and summed, read off each GPU's cumulative joules at the window's edges. Where the
    readings cover only part of the window (the sampler's first reading comes a period in), the
    covered part's mean power stands in for the rest, and `gpu_energy_coverage` says how much was
    read. With `output_tokens`: joules per output token and tokens per joule, the server's whole
    draw (other traffic included) over this variant's tokens. Empty where no GPU's energy is known."""
    readings: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for row in rows:
        if "t_ns" in row and "error" not in row:
            for gpu, reading in row.get("gpus", {}).items():
                readings.setdefault(gpu, []).append((int(row["t_ns"]), reading))
    per_gpu: dict[str, float] = {}
    sources, coverage = set(), []
    for gpu, points in sorted(readings.items()):
        found = _cumulative_joules(points)
        if found is None:
            continue
        t, joules, source = found
        start, end = (t[0], t[-1]) if window is None else (float(window[0]), float(window[1]))
        low, high = max(start, t[0]), min(end, t[-1])
        if high <= low:
            continue
        read = float(np.interp(high, t, joules) - np.interp(low, t, joules))
        share = (high - low) / (end - start)
        per_gpu[gpu] = read / share
        sources.add(source)
        coverage.append(share)
    if not per_gpu:
        return {}
    energy = sum(per_gpu.values())
    figures: dict[str, Any] = {
        "gpu_energy_j": energy,
        "gpu_energy_per_gpu_j": per_gpu,
        "gpu_energy_source": sources.pop() if len(sources) == 1 else "mixed",
        "gpu_energy_coverage": min(coverage),
    }
    if output_tokens and energy > 0:
        figures["gpu_joules_per_output_token"] = energy / output_tokens
        figures["output_tokens_per_joule"] = output_tokens / energy
    return figures


def variant_server_figures(
    server_rows: list[dict[str, Any]],
    gpu_rows: list[dict[str, Any]],
    acceptance: dict[str, Any] | None,
    window: tuple[int, int] | None = None,
    output_tokens: int | None = None,
) -> dict[str, Any]:
    """One variant's block of summary.json's `server`: the /metrics figures (acceptance per position
    pooled over the window, not per interval; gauges from the samples inside `window`), the GPU's
    (energy over `window`, per of the variant's `output_tokens`), and the server's per-request
    acceptance (analysis.request_acceptance.pooled_server_acceptance) when it sent one."""
    figures = summarize_series(server_rows, window) if server_rows else {}
    series = figures.pop("acceptance_per_position", [])
    drafts = sum(p["drafts"] for p in series)
    if drafts:
        width = max(len(p["acceptance"]) for p in series)
        figures["acceptance_per_position"] = [
            sum(p["acceptance"][i] * p["drafts"] for p in series if i < len(p["acceptance"])) / drafts
            for i in range(width)
        ]
    figures.update(gpu_figures(gpu_rows, window, output_tokens))
    if acceptance is not None:
        figures["server_acceptance_length"] = acceptance["acceptance_length"]
        figures["server_acceptance_rate"] = acceptance["acceptance_rate"]
        figures["server_k"] = acceptance["k"]
    return figures


class Signal(NamedTuple):
    """A figure of a variant's `server` block as tables and `diff` show it: its key, label, format
    (fixed-point: no table writes 2.59e-07) and resolution, the smallest difference that means
    anything (a gauge's step, a histogram's first bucket)."""

    key: str
    label: str
    fmt: str
    resolution: float


# The signals `diff` and "Why it moved" compare between two runs, and the report's server table.
SIGNALS: tuple[Signal, ...] = (
    Signal("kv_usage_p50", "KV-cache usage p50", "{:.1%}", 0.001),
    Signal("kv_usage_max", "KV-cache usage max", "{:.1%}", 0.001),
    Signal("running_max", "running requests max", "{:g}", 1),
    Signal("waiting_max", "waiting requests max", "{:g}", 1),
    Signal("preemptions", "preemptions", "{:g}", 1),
    # vLLM's queue-time histogram starts at 0.3 ms; a sum over a few requests below 1 ms is noise
    Signal("queue_time_mean_s", "time in the waiting queue, mean", "{:.3f} s", 0.001),
    Signal("prefix_hit_rate", "prefix-cache hit rate", "{:.1%}", 0.001),
    Signal("server_acceptance_length", "acceptance length (server, per request)", "{:.2f}", 0.01),
    # SGLang's gauges: its recent batches' mean acceptance length, and its generation throughput
    Signal("gauge_acceptance_length_p50", "acceptance length p50 (/metrics gauge)", "{:.2f}", 0.01),
    Signal("gen_throughput_p50", "generation throughput p50 (/metrics gauge)", "{:.0f} tok/s", 1),
    Signal("gpu_sm_clock_p50_mhz", "GPU SM clock p50", "{:.0f} MHz", 1),
    Signal("gpu_power_max_w", "GPU power max", "{:.0f} W", 1),
    Signal("gpu_temperature_max_c", "GPU temperature max", "{:.0f} °C", 1),
    Signal("gpu_util_p50_pct", "GPU utilisation p50", "{:.0f} %", 1),
    Signal("gpu_energy_j", "GPU energy over the window", "{:.1f} J", 0.1),
    Signal("gpu_joules_per_output_token", "GPU energy per output token", "{:.4f} J", 0.0001),
    Signal("output_tokens_per_joule", "output tokens per joule", "{:.2f} tok/J", 0.01),
    # analysis.roofline: the fastest a K0 token can be on this device, and the token ITL's share of it
    Signal("floor_ms", "memory-bandwidth floor per K0 token", "{:.3f} ms", 0.001),
    Signal("floor_share", "token ITL at the floor (floor / ITL p50)", "{:.1%}", 0.001),
)
SIGNAL_CHANGE = 0.10  # a signal moved when it changed by more than this fraction (or from/to zero)


@dataclass(frozen=True)
class SignalChange:
    """A server or GPU signal that differs between two runs of a variant, as shown: `base` and `new`
    formatted, `ratio` new/base where both are non-zero numbers."""

    variant: str
    label: str
    base: str
    new: str
    ratio: float | None = None


def _moved(x: float, y: float, threshold: float, resolution: float = 0.0) -> bool:
    """Changed by more than `threshold` of the larger value (so 0 → anything has moved) and by more
    than the figure's resolution (2.6e-07 s → 3.4e-07 s of queue time has not moved)."""
    return abs(y - x) > max(threshold * max(abs(x), abs(y)), resolution)


def signal_changes(
    base: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], threshold: float = SIGNAL_CHANGE
) -> list[SignalChange]:
    """What moved on the server between two runs ({variant: server block} each): every signal both
    runs have that changed by more than `threshold` (a count that went from zero counts), every
    position's acceptance that did, and throttle reasons that appeared or went."""
    out = []
    for variant in [v for v in base if v in new]:
        a, b = base[variant], new[variant]
        for key, label, fmt, resolution in SIGNALS:
            x, y = a.get(key), b.get(key)
            if not isinstance(x, int | float) or not isinstance(y, int | float):
                continue
            if _moved(x, y, threshold, resolution):
                ratio = y / x if x else None
                out.append(SignalChange(variant, label, fmt.format(x), fmt.format(y), ratio))
        for i, (x, y) in enumerate(
            zip(a.get("acceptance_per_position", []), b.get("acceptance_per_position", []), strict=False)
        ):
            if _moved(x, y, threshold):
                label = f"draft acceptance at position {i + 1} (/metrics)"
                out.append(SignalChange(variant, label, f"{x:.1%}", f"{y:.1%}", y / x if x else None))
        seen, now = set(a.get("gpu_throttle", [])), set(b.get("gpu_throttle", []))
        if seen != now and (seen or now) and "gpu_throttle" in a and "gpu_throttle" in b:
            out.append(
                SignalChange(
                    variant,
                    "GPU throttle reasons",
                    ", ".join(sorted(seen)) or "none",
                    ", ".join(sorted(now)) or "none",
                )
            )
    return out
