"""Bisect probes as Ray tasks holding one GPU each (`itlaudit bisect --parallel K --cluster ray`).

A task runs the same `run_probe` a local probe runs, on whichever node has a free GPU (Ray sets the
task's CUDA_VISIBLE_DEVICES), in a scratch folder of its own, and hands back the verdict and the probe
folder as a gzipped tar, which lands where a local probe's folder would: the caller's disk holds every
probe's files whether or not the nodes share a file system. The build is prepared on the node (its own
build cache, at the path the bisection's setup names), so each node pays for the builds it probes.

A node can die mid-probe (preempted, removed, crashed). The task is a streaming generator that names its
node first, so the caller knows which one it lost; the probe then runs again from the start on another
node, once, and if that is lost too the probe is a skip naming both nodes: a probe that did not finish
says nothing about its build, and is never judged good or bad. A failure inside the probe's own code is
not a lost node and is raised as it is.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.figures import Figures
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import ProbeConfig, ProbeResult, run_probe
from itlaudit.bisect.settings import ProbeSetup, make_provider
from itlaudit.errors import BisectError
from itlaudit.model.vocabulary import Verdict

LOST_NODE_RETRIES = 1  # reruns of a probe whose node died under it, before it counts as a skip

Packed = tuple[ProbeResult, bytes, str | None]


def probe_task(
    setup: ProbeSetup,
    config: ProbeConfig,
    build: Build,
    probe_name: str,
    reference: dict[str, Figures] | None,
) -> Iterator[str | Packed]:
    """Runs on the node: yields the node's id at once, then the probe (run in a scratch folder)
    packed with the GPU it had."""
    import ray

    yield ray.get_runtime_context().get_node_id()
    scratch = Path(tempfile.mkdtemp(prefix="itlaudit-probe-"))
    try:
        provider, _ = make_provider(setup, scratch)
        prefetcher = Prefetcher(provider, background=False)
        try:
            result = run_probe(config, prefetcher, build, scratch / probe_name, reference, lambda _pgid: None)
        finally:
            prefetcher.close()
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            if (scratch / probe_name).exists():
                tar.add(scratch / probe_name, arcname=probe_name)
        yield result, packed.getvalue(), os.environ.get("CUDA_VISIBLE_DEVICES")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def require_gpus(ray: ModuleType) -> None:
    """Each probe is a task holding one GPU: on a cluster without any it would wait forever."""
    if not ray.cluster_resources().get("GPU"):
        raise BisectError(
            "--cluster: the Ray cluster has no GPUs (now), and each probe is a task holding one; add GPU "
            "nodes and continue with --resume, or drop --cluster to probe on this host"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_probe_on_ray(
    ray: ModuleType,
    setup: ProbeSetup,
    config: ProbeConfig,
    build: Build,
    probe_dir: Path,
    reference: dict[str, Figures] | None,
    on_node: Callable[[str], None],
) -> tuple[ProbeResult, str | None, list[str]]:
    """One probe as a task with one GPU, its folder unpacked into `probe_dir`; `on_node` hears each node
    it starts on. Blocks until done. Returns the result, the GPU it had, and the nodes lost under it."""
    task = ray.remote(num_gpus=1, max_retries=0, num_returns="streaming")(probe_task)
    lost: list[str] = []
    while True:
        require_gpus(ray)
        node = "unknown"  # lost before it said where it ran
        try:
            stream = task.remote(setup, config, build, probe_dir.name, reference)
            node = ray.get(next(stream))
            on_node(node)
            result, packed, gpu = ray.get(next(stream))
        except ray.exceptions.RayTaskError:
            raise  # the probe's own code failed: a bug to see, not a node to blame
        except ray.exceptions.RayError as exc:
            lost.append(node)
            if len(lost) > LOST_NODE_RETRIES:
                nodes = ", ".join(lost)
                reason = f"lost with its Ray node each time it ran (nodes {nodes}; {_first_line(exc)})"
                return ProbeResult(Verdict.SKIP, reason), None, lost
            continue
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            tar.extractall(probe_dir.parent, filter="data")
        return result, gpu, lost
