"""Bisect probes as Ray tasks holding one GPU each (`itlaudit bisect --parallel K --cluster ray`).

A task runs the same `run_probe` a local probe runs, on whichever node has a free GPU (Ray sets the
task's CUDA_VISIBLE_DEVICES), in a scratch folder of its own, and hands back the verdict and the probe
folder as a gzipped tar, which lands where a local probe's folder would: the caller's disk holds every
probe's files whether or not the nodes share a file system. The build is prepared on the node (its own
build cache, at the path the bisection's settings name), so each node pays for the builds it probes.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import ProbeConfig, ProbeResult, run_probe
from itlaudit.bisect.settings import Settings, make_provider
from itlaudit.bisect.verdict import Figures

__all__ = ["probe_task", "run_probe_on_ray"]


def probe_task(
    settings: Settings,
    config: ProbeConfig,
    build: Build,
    probe_name: str,
    reference: dict[str, Figures] | None,
) -> tuple[ProbeResult, bytes, str | None]:
    """Runs on the node: the probe in a scratch folder, returned packed with the GPU it had."""
    scratch = Path(tempfile.mkdtemp(prefix="itlaudit-probe-"))
    try:
        provider, _ = make_provider(settings, scratch)
        prefetcher = Prefetcher(provider, background=False)
        try:
            result = run_probe(config, prefetcher, build, scratch / probe_name, reference, lambda _pgid: None)
        finally:
            prefetcher.close()
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            if (scratch / probe_name).exists():
                tar.add(scratch / probe_name, arcname=probe_name)
        return result, packed.getvalue(), os.environ.get("CUDA_VISIBLE_DEVICES")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_probe_on_ray(
    ray: ModuleType,
    settings: Settings,
    config: ProbeConfig,
    build: Build,
    probe_dir: Path,
    reference: dict[str, Figures] | None,
) -> tuple[ProbeResult, str | None]:
    """One probe as a task with one GPU; its folder unpacked into `probe_dir`. Blocks until done."""
    task = ray.remote(num_gpus=1, max_retries=0)(probe_task)
    result, packed, gpu = ray.get(task.remote(settings, config, build, probe_dir.name, reference))
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        tar.extractall(probe_dir.parent, filter="data")
    return result, gpu
