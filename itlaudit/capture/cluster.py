"""Capture workers as Ray actors, for loads one client host cannot drive faithfully.

The same capture code as a local worker (`itlaudit.capture.workers.capture_share`: one event loop per
worker, the lag probe ticking, records encoded by a writer thread) runs inside a Ray actor of one CPU;
`--workers N` actors are spread over the cluster's nodes. The coordinator stays in the calling process:
it measures each actor's monotonic clock against its own by round trips (the one with the shortest
trip wins; its error is at most half that trip), tells each actor the shared start instant on that
actor's clock, and pulls the JSON lines the actor's writer thread has written to a pipe inside the
actor, landing them in the caller's requests.jsonl exactly as a local worker's lines are landed.

An actor that dies (its node went away, its process was killed) cannot report the requests it had not
finished; the coordinator records each of them as `worker_lost`, names the actor and its Ray node (the
node id: on a cluster of one machine every node has the same hostname), and the run goes on with what
the other actors measured. Ray is imported only here, and only when `--cluster ray` asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from itlaudit.capture.described import CaptureDescription, LoopLag, WorkerDescription, WorkerWhere
from itlaudit.capture.environment import Lander
from itlaudit.capture.lagprobe import new_capture_loop
from itlaudit.capture.stamping import kernel_stamps_supported
from itlaudit.capture.workers import CLOCK_PINGS, START_MARGIN_NS, WorkerShare, capture_share
from itlaudit.errors import ClusterError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.vocabulary import StampMode
from itlaudit.store.jsonl import RecordWriter

INSTALL_HINT = "--cluster ray needs Ray on this machine: pip install 'itlaudit[ray]'"
# Dispatching `run` to every actor takes a Ray call each: on top of the workers' own start margin
# (capture/workers.py's START_MARGIN_NS, the one start margin), the start instant leaves room for them.
_RAY_DISPATCH_NS = 400_000_000
POLL_S = 0.05  # how often the coordinator pulls finished records from the actors
_READ_SIZE = 1 << 20


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ClusterError(INSTALL_HINT) from None
    return ray


def connect(address: str) -> ModuleType:
    """Join the cluster once per process; a process that already joined one (a test's local cluster,
    an earlier variant) keeps it."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = (os.environ.get("RAY_ADDRESS") or "auto") if address == "auto" else address
    try:
        ray.init(address=target, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(
            f"--cluster: no Ray cluster at {target} ({first}); start one with `ray start --head`, "
            "or give --cluster ray://HOST:PORT"
        ) from None
    return ray


def usable_cpus(ray: ModuleType, requested: int | None) -> int:
    """The cluster's CPUs, one per actor: `--workers auto` stays within them, and an explicit count
    beyond them is refused now rather than left waiting for CPUs that never come."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if requested is not None and requested > cpus:
        raise ClusterError(
            f"--workers {requested}: the Ray cluster has {cpus} CPUs and each capture actor takes one; "
            "give fewer workers or add nodes"
        )
    return max(cpus, 1)


class CaptureActor:
    """One capture worker on a Ray node. Threaded (two calls at once): `run` holds the capture loop
    on one thread while `drain` hands the coordinator what the writer thread has written so far."""

    def __init__(self, share: WorkerShare) -> None:
        self.share = share
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        if share.options.stamp == StampMode.KERNEL:
            kernel_stamps_supported()  # its one-time probe runs before the start, not mid-run

    def where(self) -> WorkerWhere:
        import ray

        context = ray.get_runtime_context()
        return {
            "node": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    def clock(self) -> int:
        return time.monotonic_ns()

    def run(self, start_ns: int) -> LoopLag:
        """Stream the share from `start_ns` (this actor's clock); returns the loop lag over the run."""
        loop, probe = new_capture_loop()

        def finish(record: RequestRecord) -> JSONObject:
            if record.lag_window is not None:
                record.loop_lag_p99_ms, record.loop_lag_max_ms = probe.window(*record.lag_window)
            return record.to_json()

        writer = RecordWriter(self._write_fd, prepare=finish)
        try:
            loop.run_until_complete(capture_share(self.share, probe, writer.write, start_ns))
        finally:
            loop.close()
            writer.close()
            os.close(self._write_fd)
        samples = np.asarray(probe.samples_ms)
        return {
            "loop_lag_p99_ms": float(np.percentile(samples, 99)) if samples.size else None,
            "loop_lag_max_ms": float(samples.max()) if samples.size else None,
            "loop_lag_ticks": int(samples.size),
        }

    def drain(self) -> bytes:
        """Whatever the writer thread has written since the last drain (may end mid-line)."""
        data = bytearray()
        with contextlib.suppress(BlockingIOError):
            while piece := os.read(self._read_fd, _READ_SIZE):
                data += piece
        return bytes(data)


@dataclass
class ActorHandle:
    share: WorkerShare
    actor: Any
    where: WorkerWhere | None = None
    clock_offset_ns: int = 0
    clock_rtt_ns: int = 0
    start_ns: int = 0
    run_ref: Any = None
    lag: LoopLag | None = None
    lost: str | None = None  # why the actor is gone, when it is

    def node(self) -> str | None:
        return self.where.get("node") if self.where is not None else None

    def describe(self) -> WorkerDescription:
        described = WorkerDescription(
            worker=self.share.worker,
            requests=len(self.share.plans),
            concurrency=self.share.concurrency,
            clock_offset_ns=self.clock_offset_ns,
            clock_rtt_ns=self.clock_rtt_ns,
            start_ns=self.start_ns,
        )
        if self.where is not None:
            described["node"], described["node_ip"] = self.where["node"], self.where["node_ip"]
            described["hostname"], described["pid"] = self.where["hostname"], self.where["pid"]
        if self.lag is not None:
            described["loop_lag_p99_ms"] = self.lag["loop_lag_p99_ms"]
            described["loop_lag_max_ms"] = self.lag["loop_lag_max_ms"]
            described["loop_lag_ticks"] = self.lag["loop_lag_ticks"]
        if self.lost is not None:
            described["lost"] = self.lost
        return described


def _measure_clock(ray: ModuleType, handle: ActorHandle) -> None:
    best: tuple[int, int] | None = None
    for _ in range(CLOCK_PINGS):
        before = time.monotonic_ns()
        theirs = ray.get(handle.actor.clock.remote())
        after = time.monotonic_ns()
        if best is None or after - before < best[1]:
            best = (theirs - (before + after) // 2, after - before)
    assert best is not None
    handle.clock_offset_ns, handle.clock_rtt_ns = best


def start_actors(ray: ModuleType, shares: list[WorkerShare]) -> list[ActorHandle]:
    """One actor per share, spread over the nodes; each is running (its `where` answered) and its clock
    measured before one start instant is set and every share is sent off."""
    remote = ray.remote(num_cpus=1, max_concurrency=2, max_restarts=0)(CaptureActor)
    options = remote.options(scheduling_strategy="SPREAD")
    handles = [ActorHandle(share, options.remote(share)) for share in shares]
    try:
        for handle, where in zip(handles, ray.get([h.actor.where.remote() for h in handles]), strict=True):
            handle.where = where
        for handle in handles:
            _measure_clock(ray, handle)
    except ray.exceptions.RayError as exc:
        stop_actors(ray, handles)
        raise ClusterError(f"--cluster: a capture actor failed to start ({_first_line(exc)})") from None
    start_ns = time.monotonic_ns() + START_MARGIN_NS + _RAY_DISPATCH_NS
    for handle in handles:
        handle.start_ns = start_ns + handle.clock_offset_ns
        handle.run_ref = handle.actor.run.remote(handle.start_ns)
    return handles


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def collect(ray: ModuleType, handles: list[ActorHandle], land: Callable[[int, bytes], None]) -> None:
    """Pull every actor's lines into `land(worker, data)` until each has finished or is lost. Blocking:
    run it off the caller's event loop."""
    running = {h.share.worker: h for h in handles}
    while running:
        refs = [h.run_ref for h in running.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
        for handle in list(running.values()):
            try:
                land(handle.share.worker, ray.get(handle.actor.drain.remote()))
                if handle.run_ref in ready:
                    handle.lag = ray.get(handle.run_ref)
                    land(handle.share.worker, ray.get(handle.actor.drain.remote()))
                    del running[handle.share.worker]
            except ray.exceptions.RayTaskError as exc:  # the capture code itself failed: not a lost node
                raise ClusterError(
                    f"capture actor {handle.share.worker} failed ({_first_line(exc)}); the records it "
                    "finished are kept in requests.jsonl"
                ) from None
            except ray.exceptions.RayError as exc:  # the actor, its process or its node is gone
                node = handle.node() or "?"
                host = handle.where["hostname"] if handle.where else "?"
                handle.lost = f"actor on node {node} ({host}) lost: {_first_line(exc)}"
                del running[handle.share.worker]


def lost_worker_warnings(described: CaptureDescription) -> list[str]:
    """What the run says about the actors it lost, from what `capture_on_ray` told `on_capture`."""
    return [
        f"warning: capture worker {lost['worker']} was lost ({lost['reason']}); its {lost['unfinished']} "
        "unfinished requests are recorded as worker_lost"
        for lost in described.get("lost_workers", [])
    ]


def stop_actors(ray: ModuleType, handles: list[ActorHandle]) -> None:
    for handle in handles:
        with contextlib.suppress(Exception):  # already dead is what we want
            ray.kill(handle.actor)


def lost_records(handle: ActorHandle, finished: set[str]) -> list[RequestRecord]:
    """The lost actor's requests that never reached us, as `worker_lost` records: the run's counts
    stay exact and the report says which requests were not measured and why."""
    return [
        plan.new_record(
            status=Status.WORKER_LOST, error=handle.lost or "capture actor lost", worker=handle.share.worker
        )
        for plan in handle.share.plans
        if plan.request_id not in finished
    ]


async def capture_on_ray(
    ray: ModuleType,
    shares: list[WorkerShare],
    lander: Lander,
    described: CaptureDescription,
    on_capture: Callable[[CaptureDescription], None] | None,
) -> None:
    """Run the shares as actors and land their records; a lost actor's unfinished requests become
    `worker_lost` records, and meta.json (through `on_capture`) gets every actor's node, clock offset
    and loop lag, and names the lost ones."""
    loop = asyncio.get_running_loop()
    handles = await loop.run_in_executor(None, start_actors, ray, shares)
    try:
        if on_capture is not None:
            on_capture({"cluster": "ray", "workers": [h.describe() for h in handles], **described})
        await loop.run_in_executor(None, collect, ray, handles, lander.feed)
    finally:
        stop_actors(ray, handles)
    finished = {record.request_id for record in lander.records}
    unfinished = {h.share.worker: lost_records(h, finished) for h in handles if h.lost is not None}
    for records in unfinished.values():
        for record in records:
            lander.add(record)
    if on_capture is not None:
        on_capture(
            {
                "workers": [h.describe() for h in handles],
                "lost_workers": [
                    {
                        "worker": worker,
                        "node": handles[worker].node(),
                        "reason": handles[worker].lost,
                        "unfinished": len(records),
                    }
                    for worker, records in unfinished.items()
                ],
            }
        )
