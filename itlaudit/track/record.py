"""A finished run folder as history points: one per variant, its fingerprint, validity and raw figures.

`run`, `compare` and each sweep trial leave the same folder (requests.jsonl, meta.json); the ledger's
fingerprint (store/ledger.py) is split here into what names a series (platform, model, variant,
workload, client settings) and what may change from one build to the next (the build itself, and the
method: server args, environment, build flavour). The build's position in first-parent order comes
from the caller (`--order`) or the run's `--metadata build_order=N`; without either, the run's start
time orders it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from itlaudit.analysis.changes import CLIENT, CORRECTNESS, LENGTH, SAMPLE_FIELDS, VALID
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.request_acceptance import server_acceptance
from itlaudit.analysis.server_metrics import KV_USAGE
from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import variant_validity
from itlaudit.errors import ItlauditError, TrackError
from itlaudit.model.codes import CLIENT_SATURATED, COMMON_CAP, TRUNCATION_CODES
from itlaudit.model.jsonvalue import JSONObject, JSONScalar
from itlaudit.model.meta import Meta, MetaVariant
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_context import quality_settings
from itlaudit.store.jsonl import load_records
from itlaudit.store.ledger import run_fingerprints
from itlaudit.store.rundir import META_FILE, REQUESTS_FILE, SUMMARY_FILE
from itlaudit.store.server_metrics import read_telemetry
from itlaudit.track.db import NewPoint, open_history
from itlaudit.workflows.run_folder import RunFolder


@dataclass(frozen=True)
class BuildInfo:
    """What the caller knows about the build beyond the run folder (each None: read from the run)."""

    order: int | None = None
    version: str | None = None
    commit: str | None = None
    flavour: str | None = None


def find_run_dirs(path: Path) -> list[Path]:
    """The run folders at or under `path` (a sweep holds one per variant, load and trial)."""
    if (path / REQUESTS_FILE).is_file() and (path / META_FILE).is_file():
        return [path]
    if not path.is_dir():
        raise TrackError(f"{path}: no such run folder; give a folder written by run, compare or sweep")
    found = sorted(p.parent for p in path.rglob(META_FILE) if (p.parent / REQUESTS_FILE).is_file())
    if not found:
        raise TrackError(f"{path}: holds no run folder (requests.jsonl and meta.json); nothing to record")
    return found


def _cap(summary: RunSummary, variant: str) -> int | None:
    for finding in summary.run_findings:
        evidence = finding.get("evidence") or {}
        if finding.get("code") == COMMON_CAP and evidence.get("variant") == variant:
            return int(evidence["cap"])
    return None


def _validity(summary: RunSummary, variant: str) -> tuple[str, str | None]:
    """analysis/validity.py's rule, its reason kept, and the kind that names the change class; a
    client saturated on most requests is a fourth way for a point not to be a speed."""
    block = summary.variants.get(variant)
    counts = block.findings if block is not None else {}
    requests = block.requests if block is not None else 0
    rule = variant_validity(summary, variant)
    if not rule.comparable:
        if any(counts.get(code) for code in TRUNCATION_CODES):
            return LENGTH, rule.reason
        return CORRECTNESS, rule.reason
    saturated = int(counts.get(CLIENT_SATURATED, 0))
    # As gibberish: most requests, so one stall on a loaded machine does not split the series.
    if saturated * 2 > requests:
        return CLIENT, f"{saturated} of {requests} requests timed by a saturated client"
    return VALID, None


def _samples(
    records: Sequence[RequestRecord],
    server_rows: Sequence[Mapping[str, Any]],
    gpu_rows: Sequence[Mapping[str, Any]],
    joules_per_token: float | None = None,
) -> dict[str, list[float | None]]:
    """Each request's figures, and the server's raw samples over the window (changes.SERVER_SERIES):
    each /metrics scrape's KV-cache usage, each request's server-side acceptance length, each NVML
    reading's SM clock and power, the window's GPU joules per output token; a sample the run did not
    take is left out."""
    metrics = [asdict(request_metrics(r)) for r in records]
    samples: dict[str, list[float | None]] = {name: [m[name] for m in metrics] for name in SAMPLE_FIELDS}
    taken = [r for r in server_rows if "error" not in r]
    gpus = [g for r in gpu_rows if "error" not in r for g in (r.get("gpus") or {}).values()]
    acceptance = [c for c in map(server_acceptance, records) if c is not None and c["steps"]]
    found: dict[str, list[float]] = {
        "server.kv_usage": [float(r["gauges"][KV_USAGE]) for r in taken if KV_USAGE in r.get("gauges", {})],
        "server.acceptance_length": [1.0 + c["accepted"] / c["steps"] for c in acceptance],
        "server.gpu_sm_clock_mhz": [float(g["sm_clock_mhz"]) for g in gpus if _number(g.get("sm_clock_mhz"))],
        "server.gpu_power_w": [float(g["power_w"]) for g in gpus if _number(g.get("power_w"))],
        # the window's figure (summary.json's server block), one sample: energy is not per request
        "server.gpu_joules_per_token": [] if joules_per_token is None else [joules_per_token],
    }
    samples.update({name: list(values) for name, values in found.items() if values})
    return samples


def _joules_per_token(summary: RunSummary, variant: str) -> float | None:
    value = (summary.server.get(variant) or {}).get("gpu_joules_per_output_token")
    return float(value) if isinstance(value, int | float) else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _platform(meta: Meta) -> JSONObject:
    return {
        "gpus": [f"{g['name']} (sm {g['compute_capability']})" for g in meta.gpus] or None,
        "arch": meta.environment["cpu_architecture"] if meta.environment else None,
    }


def _text(value: JSONScalar) -> str | None:
    """A --metadata value as text (`track nightly` writes its build order as a number)."""
    return None if value is None else str(value)


def _commit(info: MetaVariant) -> str | None:
    """The vLLM commit the variant's server reported (its environment record), if any."""
    return info.server.get("vllm_commit") if info.server else None


def _most_common(values: Sequence[str | None]) -> str | None:
    counted = Counter(v for v in values if v)
    return counted.most_common(1)[0][0] if counted else None


def run_points(run_dir: Path, build: BuildInfo | None = None) -> list[NewPoint]:
    """One point per variant of a finished run folder."""
    build = build or BuildInfo()
    try:
        meta = RunFolder.open(run_dir).meta_file
        all_records = [r for r in load_records(run_dir / REQUESTS_FILE) if not r.warmup]
        fingerprints = run_fingerprints(run_dir, all_records, {})
    except (ItlauditError, OSError, ValueError) as exc:
        raise TrackError(f"{run_dir}: cannot be recorded ({exc})") from None
    if meta.ended_early:
        raise TrackError(f"{run_dir}: the run did not finish; record a finished run")
    if not (run_dir / SUMMARY_FILE).is_file():
        # Killed (SIGKILL, a second signal) after its records and before its figures: every
        # request may be there, yet nothing says the run ended as a run does (issue 39 item 1).
        raise TrackError(
            f"{run_dir}: no {SUMMARY_FILE}, so the run did not finish deriving its figures; "
            f"`itlaudit report {run_dir}` derives them, then add it"
        )
    try:
        quality = quality_settings(meta)
    except ItlauditError as exc:
        raise TrackError(f"{run_dir}: cannot be recorded ({exc})") from None
    summary = summarize_run(all_records, list(fingerprints), quality=quality)
    try:
        telemetry = read_telemetry(run_dir)
    except (ItlauditError, OSError, ValueError) as exc:
        raise TrackError(f"{run_dir}: its server metrics cannot be read ({exc})") from None
    metadata = meta.metadata
    order, given = build.order, metadata.get("build_order")
    if order is None and given is not None:
        try:
            order = int(given)
        except ValueError:
            raise TrackError(f"{run_dir}: metadata build_order={given!r} is not an integer") from None
    if order is None:
        order = int(meta.started_at_unix or 0)
    points = []
    for variant, fingerprint in fingerprints.items():
        records = [r for r in all_records if r.variant == variant]
        info = meta.variant(variant)
        kind, reason = _validity(summary, variant)
        workload = json.dumps(fingerprint.workload, sort_keys=True).encode()
        series = {
            "platform": _platform(meta),
            "model": _most_common([r.model for r in records]) or fingerprint.workload.get("model"),
            "workload": hashlib.sha256(workload).hexdigest()[:16],
            "client": {
                "stamp": _most_common([r.stamp for r in records]),
                "workers": info.workers_count or None,
            },
            # A server we only connect to is told apart by its host; the port is where it listens today.
            "host": urlsplit(fingerprint.build["url"]).hostname if fingerprint.build.get("url") else None,
        }
        flavour = build.flavour or _text(metadata.get("build_variant"))
        points.append(
            NewPoint(
                series_fingerprint=series,
                variant=variant,
                run_id=f"{run_dir.resolve()}",
                run_dir=str(run_dir),
                build_order=order,
                build_version=build.version or fingerprint.build.get("version"),
                build_commit=build.commit or _text(metadata.get("commit")) or _commit(info),
                build_flavour=flavour,
                method={"args": fingerprint.server_args, "env": fingerprint.env, "flavour": flavour},
                validity=kind,
                reason=reason,
                cap=_cap(summary, variant) if kind == LENGTH else None,
                errors=summary.variants[variant].errors if variant in summary.variants else 0,
                samples=_samples(
                    records,
                    telemetry["server"].get(variant, []),
                    telemetry["gpu"].get(variant, []),
                    _joules_per_token(summary, variant),
                ),
            )
        )
    return points


def record(db: str | None, paths: Sequence[Path], build: BuildInfo | None = None) -> tuple[int, int, str]:
    """Record the run folders at or under `paths` in the history at `db`: (points written, folders,
    the history's name). Every folder is read before the history is touched, so a bad one adds none."""
    folders = [found for path in paths for found in find_run_dirs(path)]
    points = [p for folder in folders for p in run_points(folder, build)]
    history = open_history(db)
    try:
        written = history.add(points)
    finally:
        history.close()
    return written, len(folders), history.where
