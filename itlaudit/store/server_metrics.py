"""The samplers' files read back (server_metrics.jsonl, gpu_telemetry.jsonl): rows by variant, in
time order (the file's format is checked from its header line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from itlaudit.analysis.server_metrics import SERVER_METRICS_FILE
from itlaudit.model.formats import FORMAT_KEY, check_format
from itlaudit.store.jsonl import iter_jsonl

__all__ = ["read_server_metrics"]


def read_server_metrics(run_dir: Path, name: str = SERVER_METRICS_FILE) -> dict[str, list[dict[str, Any]]]:
    """{variant: rows} with a time (`t_ns`): figures and error rows; empty when the run sampled
    nothing. `name`: the sampler's file (server_metrics.jsonl, or the GPU's gpu_telemetry.jsonl). A
    file in a format this itlaudit does not read is one RecordsError line."""
    path = run_dir / name
    if not path.is_file():
        return {}
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for line in iter_jsonl(path):
        if FORMAT_KEY in line:
            check_format(path, line)
        elif "t_ns" in line and isinstance(line.get("variant"), str):
            by_variant.setdefault(line["variant"], []).append(line)
    for rows in by_variant.values():
        rows.sort(key=lambda row: row["t_ns"])
    return by_variant
