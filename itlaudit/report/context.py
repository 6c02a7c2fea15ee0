"""What every report says before its figures: when, by which itlaudit and command, against which
servers (and which build: a simulator says so), on what host, with what workload and capture.

A figure without its context cannot be compared or repeated: two runs a week apart against "the
same server" may be two builds, and a simulated run must never read as a vLLM measurement. Facts
come from meta.json (written by the run) and summary.json; each is a (label, raw text) pair that
the Markdown, HTML and smoke reports render and escape their own way.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping

from msgspec import UnsetType

from itlaudit.analysis.specdecode import speculation_text
from itlaudit.analysis.summary import RunSummary
from itlaudit.model.meta import EnvironmentRecord, HostEnvironment, Meta, WorkloadMeta
from itlaudit.model.run_context import server_build
from itlaudit.model.vocabulary import QualityGate

Fact = tuple[str, str]  # (label, raw text): rendered as "**label**: text"


def host_facts(host: HostEnvironment | None) -> list[Fact]:
    """itlaudit's version and the machine it ran on (the server's too when itlaudit launched it)."""
    gpus = host["gpus"] if host else None
    gpu_text = ", ".join(f"{g['name']} (cc {g['compute_capability']})" for g in gpus) if gpus else "none seen"
    known: Mapping[str, object] = host or {}  # a folder from before the record: each part unknown
    return [
        ("itlaudit", str(known.get("itlaudit_version"))),
        ("host", f"{known.get('cpu_architecture')}, {known.get('platform')}, Python {known.get('python')}"),
        ("GPUs (local nvidia-smi)", gpu_text),
    ]


def server_fact(server: EnvironmentRecord | None, url: str | None = None) -> str:
    """One server: URL, build (vLLM version and commit, the simulator, or unknown), fingerprint, and
    whether itlaudit launched it."""
    version = (server.get("server_version") or server.get("vllm_version")) if server else None
    known: Mapping[str, object] = server or {}  # a server whose pass did not get that far: unknown
    commit = known.get("vllm_commit")
    launched = known.get("launch_kind") or "no (--url)"
    return (
        f"{known.get('url') or url}: {server_build(version)}{f' (commit {commit})' if commit else ''}, "
        f"system_fingerprint {known.get('system_fingerprint')}, launched: {launched}"
    )


def workload_text(workload: WorkloadMeta) -> str:
    """meta.json's "workload" in vllm bench serve's words: requests, warmups, concurrency, rate, data."""
    rate = workload.get("request_rate")
    parts = [
        f"{workload.get('num_prompts')} requests"
        + (f" (+{workload['num_warmups']} warmup)" if workload.get("num_warmups") else ""),
        f"max concurrency {workload.get('max_concurrency')}",
        "request rate inf (closed loop)"
        if rate is None
        else f"request rate {rate}/s (burstiness {workload.get('burstiness')})",
        "the scenario's prompt list"
        if workload.get("dataset") == "prompts"
        else f"{workload.get('dataset')} dataset",
    ]
    if workload.get("input_len") is not None:
        parts.append(f"input {workload['input_len']} tokens")
    parts.append(f"max_tokens {workload.get('max_tokens') or 'unset'}")
    if workload.get("ignore_eos"):
        parts.append("ignore_eos")
    if workload.get("temperature") is not None:
        parts.append(f"temperature {workload['temperature']}")
    if workload.get("duration_s") is not None:
        grace = workload.get("duration_grace_s")
        cut = f" (streams still open are cut {grace} s later)" if grace is not None else ""
        parts.append(f"stops sending after {workload['duration_s']} s{cut}")
    return f"{', '.join(parts)}; /v1/{workload.get('endpoint')}"


def _capture_text(summary: RunSummary, meta: Meta) -> str:
    """How the chunks were stamped (per request: kernel receive time or loop clock) and by how many
    capture processes."""
    stamps: Counter[str] = Counter()
    for block in summary.variants.values():
        stamps.update(block.stamp)
    workers = {name: info.workers_count for name, info in meta.variants.items() if info.workers_count}
    stamp_text = ", ".join(f"{mode} ({n} requests)" for mode, n in stamps.most_common()) or "unknown"
    counts = sorted(set(workers.values()))
    if not counts:
        worker_text = "capture processes not recorded"
    elif len(counts) == 1:
        worker_text = f"{counts[0]} capture process{'es' if counts[0] != 1 else ''}"
    else:
        worker_text = ", ".join(f"{name} {n}" for name, n in workers.items()) + " capture processes"
    return f"stamps: {stamp_text}; {worker_text}"


def context_facts(meta: Meta, summary: RunSummary) -> list[Fact]:
    """The report's context block for one run folder, in reading order."""
    started = meta.started_at_unix
    facts: list[Fact] = [
        ("date", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if started else "unknown"),
    ]
    host = meta.environment
    facts += host_facts(host)[:1]
    if meta.command_line:
        facts.append(("command", meta.command_line))
    if meta.label:
        facts.append(("label", meta.label))
    if meta.metadata:
        facts.append(("metadata", ", ".join(f"{k}={v}" for k, v in meta.metadata.items())))
    cap = (meta.workload or {}).get("max_concurrency")
    for name, info in meta.variants.items():
        facts.append((f"server {name}", server_fact(info.server, info.url)))
        if not isinstance(
            info.speculative_config, UnsetType
        ):  # known: launched, or declared for a URL server
            block = summary.variants.get(name)
            measured = block.decode_tokens_per_chunk.get("mean") if block is not None else None
            text = speculation_text(
                info.speculative_config,
                cap,
                float(measured) if isinstance(measured, int | float) else None,
            )
            facts.append((f"speculation {name}", text))
        elif isinstance(k := (summary.server.get(name) or {}).get("server_k"), int):
            # an attached server said nothing of its arguments, but its per-request metrics did
            facts.append((f"speculation {name}", f"K={k}, as its per-request spec-decode metrics report it"))
    models = sorted({b.model for b in summary.variants.values() if b.model})
    facts.append(("model", ", ".join(models) or "unknown"))
    if summary.dummy_weights:
        facts.append(("weights", f"dummy (--load-format dummy): {', '.join(summary.dummy_weights)}"))
    if summary.quality_gate is not QualityGate.RELATIVE:
        facts.append(("quality gate", str(summary.quality_gate)))
    facts += host_facts(host)[1:]
    if meta.workload:
        facts.append(("workload", workload_text(meta.workload)))
    facts.append(("capture", _capture_text(summary, meta)))
    if meta.interrupted:
        facts.append(("interrupted", f"by {meta.interrupted.get('signal')}: only finished requests count"))
    if meta.failed:
        facts.append(("failed", f"{meta.failed.get('error')}: only finished requests count"))
    return facts
