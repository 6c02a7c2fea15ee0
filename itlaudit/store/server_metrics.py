"""The samplers' files read back (server_metrics.jsonl, gpu_telemetry.jsonl): rows by variant, in
time order (the file's format is checked from its header line)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import msgspec

from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.request_acceptance import pooled_server_acceptance
from itlaudit.analysis.roofline import FloorFigures, variant_floor
from itlaudit.analysis.server_metrics import GPU_TELEMETRY_FILE, SERVER_METRICS_FILE, variant_server_figures
from itlaudit.model.formats import FORMAT_KEY, check_format
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.meta import Meta
from itlaudit.model.records import RequestRecord, Status
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import iter_jsonl


def read_server_metrics(run_dir: Path, name: str = SERVER_METRICS_FILE) -> dict[str, list[JSONObject]]:
    """{variant: rows} with a time (`t_ns`): figures and error rows; empty when the run sampled
    nothing. `name`: the sampler's file (server_metrics.jsonl, or the GPU's gpu_telemetry.jsonl). A
    file in a format this itlaudit does not read is one RecordsError line."""
    path = run_dir / name
    if not path.is_file():
        return {}
    by_variant: dict[str, list[JSONObject]] = {}
    for line in iter_jsonl(path):
        if FORMAT_KEY in line:
            check_format(path, line)
        elif isinstance(line.get("t_ns"), int | float) and isinstance(variant := line.get("variant"), str):
            by_variant.setdefault(variant, []).append(line)
    for rows in by_variant.values():
        rows.sort(key=_t_ns)
    return by_variant


def _t_ns(row: JSONObject) -> float:
    """A row's time; read_server_metrics keeps only rows whose `t_ns` is a number."""
    t_ns = row["t_ns"]
    assert isinstance(t_ns, int | float)
    return t_ns


def read_telemetry(run_dir: Path) -> dict[str, dict[str, list[JSONObject]]]:
    """Both samplers' rows: {"server": {variant: rows}, "gpu": {variant: rows}}."""
    return {"server": read_server_metrics(run_dir), "gpu": read_server_metrics(run_dir, GPU_TELEMETRY_FILE)}


def _clock_offsets(meta: Meta) -> dict[str, dict[int, int]]:
    """Per variant, each capture worker's monotonic clock offset from the coordinator's (meta.json's
    workers; theirs − ours), so a worker's send time reads on the samplers' clock. A folder without
    them (or a worker on this host) has none: offset 0."""
    offsets: dict[str, dict[int, int]] = {}
    for name, info in meta.variants.items():
        for worker in info.workers or []:
            offset, index = worker.get("clock_offset_ns"), worker.get("worker")
            if isinstance(offset, int):
                offsets.setdefault(name, {})[index if isinstance(index, int) else 0] = offset
    return offsets


def _window(records: Sequence[RequestRecord], offsets: dict[int, int]) -> tuple[int, int] | None:
    """The variant's measured span on the samplers' monotonic clock: first send to last end; None
    without timed records."""
    spans = [
        (start, start + int(r.e2e_ms * 1e6))
        for r in records
        if r.sent_monotonic_ns is not None and r.e2e_ms is not None
        for start in [r.sent_monotonic_ns - offsets.get(r.worker, 0)]
    ]
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans)


def _device(gpu_rows: Sequence[JSONObject], meta: Meta) -> str | None:
    """The device the variant's server ran on, as NVML names it: the GPU sampler's start row, else
    the host environment meta.json recorded (its first GPU)."""
    for row in gpu_rows:
        names = row.get("gpus") if row.get("start") else None
        if isinstance(names, dict):
            found = [str(v) for v in names.values() if isinstance(v, str)]
            if found:
                return found[0]
    return meta.gpus[0]["name"] if meta.gpus else None


def _floor(
    meta: Meta, name: str, records: Sequence[RequestRecord], gpu_rows: Sequence[JSONObject]
) -> FloorFigures:
    """The variant's memory-bandwidth floor (analysis.roofline.variant_floor) at the run's mean context
    (prompt plus half the reply: the middle of a decode) and batch (the concurrency cap, or every
    request where none), beside its token ITL p50. The run's --model-config, else the config.json
    of the model its launched server loaded (said only where a floor comes of it: a run that asked
    for none is not told why it has none)."""
    roofline = meta.roofline
    asked = roofline.model_config is not None or roofline.bytes_per_token is not None
    launched_config = meta.variant(name).model_config
    if not asked and launched_config:
        roofline = msgspec.structs.replace(roofline, model_config=launched_config)
    ok = [r for r in records if r.status == Status.OK]
    if not ok:
        return {}
    metrics = [request_metrics(r) for r in ok]
    contexts = [
        (r.prompt_tokens or 0) + (m.completion_tokens or 0) / 2 for r, m in zip(ok, metrics, strict=True)
    ]
    cap = (meta.workload or {}).get("max_concurrency")
    batch = min(cap, len(ok)) if isinstance(cap, int) and cap > 0 else len(ok)
    itl = [m.itl_ms for m in metrics if m.itl_ms is not None]
    floor = variant_floor(
        roofline,
        _device(gpu_rows, meta),
        statistics.fmean(contexts),
        batch,
        statistics.median(itl) if itl else None,
    )
    return floor if asked or "floor_note" not in floor else {}


def _output_tokens(records: Sequence[RequestRecord]) -> int:
    """The variant's output tokens as its block's total_output_tokens counts them (benchmark_figures):
    each completed request's usage, or its counted tokens where the server sent none."""
    return sum(
        r.completion_tokens if r.completion_tokens is not None else request_metrics(r).completion_tokens or 0
        for r in records
        if r.status == Status.OK
    )


def server_blocks(
    run_dir: Path,
    records: Sequence[RequestRecord],
    telemetry: dict[str, dict[str, list[JSONObject]]] | None = None,
) -> dict[str, JSONObject]:
    """summary.json's `server`: per variant, what its server and GPU said during the measured window
    and its per-request acceptance (analysis.server_metrics.variant_server_figures); a variant with
    none of them has no block."""
    telemetry = telemetry if telemetry is not None else read_telemetry(run_dir)
    server, gpu = telemetry["server"], telemetry["gpu"]
    names = list(dict.fromkeys([*(r.variant for r in records), *server, *gpu]))
    meta = RunFiles(run_dir).meta_as_context
    offsets = _clock_offsets(meta)
    blocks = {}
    for name in names:
        mine = [r for r in records if r.variant == name]
        acceptance = pooled_server_acceptance(mine)
        window = _window(mine, offsets.get(name, {}))
        block = variant_server_figures(
            server.get(name, []), gpu.get(name, []), acceptance, window, _output_tokens(mine)
        )
        block.update(_floor(meta, name, mine, gpu.get(name, [])))
        if block:
            blocks[name] = block
    return blocks
