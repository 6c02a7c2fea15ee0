"""Capture workers: processes that each run their share of a variant's requests on their own loop.

One event loop can stamp only so many streams before its callbacks queue behind each other, so the
coordinator (`itlaudit.capture.runner`) splits the workload over processes. Each worker:

- dies with the coordinator: a thread blocks on the control pipe, whose other end only the coordinator
  holds and which carries nothing after the start, so its end (the coordinator's death, SIGKILL included)
  ends the worker at once, before another request is sent, and quietly, since nobody is left to read a
  record or a traceback. PR_SET_PDEATHSIG alone is not enough: a forkserver child's parent is the
  forkserver, which outlives the coordinator by up to seconds;
- answers clock pings before the start, so the coordinator can measure its monotonic clock's offset
  (kept in meta.json: per-request figures use the worker's own clock, a shared timeline the offset);
- waits at a barrier with the others, so all shares start together;
- streams its share at its share of the concurrency, with the lag probe ticking the whole time;
- hands each finished record to a writer thread that adds the record's loop-lag figures, encodes it
  and writes it as one JSON line to the coordinator's pipe, which appends it to requests.jsonl.

Nothing else runs on the worker's loop while its streams are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.util
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

from itlaudit.capture.client import StreamOptions, stream_request
from itlaudit.capture.described import WorkerDescription
from itlaudit.capture.lagprobe import LagProbe, new_capture_loop
from itlaudit.capture.request_plan import PlannedRequest
from itlaudit.capture.stamping import kernel_stamps_supported
from itlaudit.errors import RecordsError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.vocabulary import StampMode
from itlaudit.serve.orphans import die_with_parent
from itlaudit.store.jsonl import RecordWriter

# Streams per worker for `--workers auto`. A chunk costs a worker ~40 µs of CPU on the 2-core development
# machine (kernel stamps, h11 framing, SSE, msgspec: measured with 16 streams × 500 chunks/s), so 16
# such streams keep its loop about a third busy, which leaves room for bursts without queueing reads.
STREAMS_PER_WORKER = 16
RETRY_AFTER_CAP_S = 30.0  # a Retry-After is honoured up to this long, so a bogus one cannot hang a run
CLOCK_PINGS = 7
START_MARGIN_NS = 100_000_000
# The writer thread (encoding finished records) shares the worker's GIL with the loop, and the loop gives
# the GIL up in every recv and poll: at the default 5 ms interval each of those could cost the loop that
# long while records are being encoded, which as 64 streams ended stalled reads by 8-16 ms. At 0.2 ms the
# loop takes it back within a fraction of one 2 ms chunk gap.
SWITCH_INTERVAL_S = 0.0002
# The process that imported this module: in a worker, the forkserver that forked it, which preloads
# this module (_context) before it forks any.
_FORKER = os.getpid()


@dataclass(frozen=True)
class WorkerShare:
    """One worker's part of a variant: its requests, in order, how many may be open at once, and how
    each is sent (limits, stamp mode, headers and TLS: one object for the share)."""

    worker: int
    plans: list[PlannedRequest]
    concurrency: int
    options: StreamOptions
    duration_s: float | None = None  # stop dispatching this long after the start


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_count(requested: int | None, concurrency: int, num_requests: int, cores: int | None = None) -> int:
    """`None` is auto: enough workers that each keeps at most STREAMS_PER_WORKER streams, capped at the
    cores (this machine's, or a Ray cluster's CPUs). Never more workers than streams or requests, since
    an idle worker only costs a process."""
    wanted = requested if requested is not None else math.ceil(concurrency / STREAMS_PER_WORKER)
    if requested is None:
        wanted = min(wanted, cores if cores is not None else available_cores())
    return max(1, min(wanted, concurrency, num_requests))


def split_shares(
    plans: list[PlannedRequest],
    concurrency: int,
    options: StreamOptions,
    workers: int,
    *,
    duration_s: float | None = None,
) -> list[WorkerShare]:
    """Request i goes to worker i mod N (an open loop's schedule too: each worker keeps its requests'
    offsets, in order), a multi-turn session's requests to worker session mod N, so its turns run in
    order on one client; concurrency is spread as evenly as it divides."""
    if plans and plans[0].session is not None:
        shares = [[p for p in plans if (p.session or 0) % workers == w] for w in range(workers)]
    else:
        shares = [plans[w::workers] for w in range(workers)]
    return [
        WorkerShare(
            worker=w,
            plans=shares[w],
            concurrency=concurrency // workers + (1 if w < concurrency % workers else 0),
            options=options,
            duration_s=duration_s,
        )
        for w in range(workers)
    ]


def rejected(record: RequestRecord) -> bool:
    """A redirect or a 4xx other than 429 refuses every request of the workload alike: stop early."""
    status = record.http_status or 0
    return record.status == Status.HTTP_ERROR and 300 <= status < 500


async def capture_share(share: WorkerShare, probe: LagProbe, keep: Any, start_ns: int | None = None) -> None:
    """Stream the share from `start_ns` (this worker's clock: the coordinator's start instant shifted
    by this worker's measured offset, so every worker's schedule shares one zero; None is now).
    Planned offsets make it an open loop; without them it is the closed loop at the share's
    concurrency. The share's duration cut (Timeouts.duration_cut_s) counts from the same zero."""
    if start_ns is None:
        start_ns = time.monotonic_ns()
    if share.options.timeouts.duration_cut_s is not None:
        timeouts = dataclasses.replace(share.options.timeouts, start_s=start_ns / 1e9)
        share = dataclasses.replace(share, options=dataclasses.replace(share.options, timeouts=timeouts))
    probe.start()
    try:
        delay_s = (start_ns - time.monotonic_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if share.plans and share.plans[0].scheduled_ms is not None:
            await _open_loop(share, probe, keep, start_ns)
        else:
            await _closed_loop(share, probe, keep, start_ns)
    finally:
        probe.stop()


def _past_duration(share: WorkerShare, start_ns: int, now_ns: int) -> bool:
    return share.duration_s is not None and now_ns - start_ns > share.duration_s * 1e9


def _sessions(plans: list[PlannedRequest]) -> list[list[PlannedRequest]]:
    """The plans as a closed loop's units of work: a multi-turn session's consecutive turns together,
    every other request alone."""
    units: list[list[PlannedRequest]] = []
    for plan in plans:
        if plan.session is not None and units and units[-1][-1].session == plan.session:
            units[-1].append(plan)
        else:
            units.append([plan])
    return units


async def _closed_loop(share: WorkerShare, probe: LagProbe, keep: Any, start_ns: int) -> None:
    """Each slot sends its next request when its last one ends, honours a 429/503's Retry-After
    (capped) first, and the whole share stops at the first rejection or at duration_s. A slot takes
    a multi-turn session whole: each turn after the last one's reply and its think time."""
    queue = list(reversed(_sessions(share.plans)))
    stop = False

    async def slot() -> None:
        nonlocal stop
        while queue and not stop:
            for turn, plan in enumerate(queue.pop()):
                if turn and plan.think_s:
                    await asyncio.sleep(plan.think_s)
                dispatched_ns = time.monotonic_ns()
                if stop or _past_duration(share, start_ns, dispatched_ns):
                    return
                record = await stream_request(plan, share.options, probe)
                record.sent_offset_ms = (dispatched_ns - start_ns) / 1e6
                record.worker = share.worker
                keep(record)
                if rejected(record):
                    stop = True
                elif record.status == Status.RATE_LIMITED and record.retry_after_s:
                    await asyncio.sleep(min(record.retry_after_s, RETRY_AFTER_CAP_S))

    await asyncio.gather(*(slot() for _ in range(share.concurrency)))


async def _open_loop(share: WorkerShare, probe: LagProbe, keep: Any, start_ns: int) -> None:
    """Each request is dispatched at its scheduled offset whatever the others are doing (a Retry-After
    does not move the schedule), but no more than the share's concurrency are open at once: a request
    that waits for a free slot is dispatched late, and that lateness is its schedule lag."""
    slots = asyncio.Semaphore(share.concurrency)
    open_requests: set[asyncio.Task[None]] = set()
    stop = False

    async def send(plan: PlannedRequest, dispatched_ns: int) -> None:
        nonlocal stop
        try:
            record = await stream_request(plan, share.options, probe)
        finally:
            slots.release()
        record.sent_offset_ms = (dispatched_ns - start_ns) / 1e6
        record.worker = share.worker
        keep(record)
        stop = stop or rejected(record)

    for plan in share.plans:
        due_ns = start_ns + round((plan.scheduled_ms or 0.0) * 1e6)
        delay_s = (due_ns - time.monotonic_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        await slots.acquire()
        dispatched_ns = time.monotonic_ns()
        if stop or _past_duration(share, start_ns, dispatched_ns):
            slots.release()
            break
        task = asyncio.create_task(send(plan, dispatched_ns))
        open_requests.add(task)
        task.add_done_callback(open_requests.discard)
    await asyncio.gather(*open_requests)


def _die_with_parent() -> None:
    """SIGKILL this worker when the forkserver that forked it dies (with its coordinator). The kernel
    sends it only for a death after the prctl, so a forkserver gone between the fork and the prctl is
    checked for right after it, as for a launched server (serve.orphans.die_with_parent). A worker
    that imported this module itself (spawn, or a forkserver started without the preload) knows no
    such parent; the control pipe ends it all the same (_exit_with_coordinator)."""
    if os.getpid() != _FORKER:
        die_with_parent(_FORKER)


def _exit_with_coordinator(control: Connection) -> None:
    """Ends this process the moment the control pipe's other end closes: after the start the coordinator
    sends nothing on it, so the pipe turns readable only at its EOF. A thread, so that it also fires
    while the main thread waits at the barrier or runs the loop; it costs the loop nothing until then."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            control.poll(None)
        os._exit(0)

    threading.Thread(target=watch, name="coordinator-watch", daemon=True).start()


def worker_main(share: WorkerShare, records_out: Connection, control: Connection, barrier: Barrier) -> None:
    """Entry point of a worker process (see the module docstring)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator decides what an interrupt ends
    if share.options.stamp == StampMode.KERNEL:
        kernel_stamps_supported()  # its one-time probe (up to ~0.1 s) runs before the start, not mid-run
    try:
        while control.recv() is not None:
            control.send(time.monotonic_ns())
        start_ns: int = control.recv()  # on this worker's clock
    except (EOFError, OSError):
        os._exit(0)  # the coordinator died before the start: nothing to capture, nobody to tell
    _exit_with_coordinator(control)
    loop, probe = new_capture_loop()

    def finish(record: RequestRecord) -> JSONObject:
        if record.lag_window is not None:
            record.loop_lag_p99_ms, record.loop_lag_max_ms = probe.window(*record.lag_window)
        return record.to_json()

    writer = RecordWriter(records_out.fileno(), prepare=finish)
    # A full collection walks every object the imports made (~34000: 18 ms with the loop stopped);
    # frozen, they are never walked again, and what collections remain cover only the run's own objects.
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    barrier.wait()
    try:
        try:
            loop.run_until_complete(capture_share(share, probe, writer.write, start_ns))
        finally:
            loop.close()
            writer.close()
            records_out.close()
    except RecordsError:
        # A broken records pipe whose reader is gone (the watch thread may not have run yet) is the
        # coordinator's death, not a full disk: leave without a traceback nobody can act on.
        if control.poll(0):
            os._exit(0)
        raise


@dataclass
class WorkerHandle:
    share: WorkerShare
    process: multiprocessing.process.BaseProcess
    records_in: Connection
    control: Connection
    clock_offset_ns: int = 0
    clock_rtt_ns: int = 0
    start_ns: int = 0  # the shared start instant on this worker's clock

    def measure_clock(self) -> None:
        """Offset of the worker's monotonic clock from ours, from the ping with the shortest round
        trip (its error is at most half that round trip)."""
        best: tuple[int, int] | None = None
        for _ in range(CLOCK_PINGS):
            before = time.monotonic_ns()
            self.control.send(before)
            theirs = self.control.recv()
            after = time.monotonic_ns()
            rtt = after - before
            if best is None or rtt < best[1]:
                best = (theirs - (before + after) // 2, rtt)
        self.control.send(None)
        assert best is not None
        self.clock_offset_ns, self.clock_rtt_ns = best

    def describe(self) -> WorkerDescription:
        return {
            "worker": self.share.worker,
            "pid": self.process.pid,
            "requests": len(self.share.plans),
            "concurrency": self.share.concurrency,
            "clock_offset_ns": self.clock_offset_ns,
            "clock_rtt_ns": self.clock_rtt_ns,
            "start_ns": self.start_ns,
        }


# A Unix socket's path is at most 107 bytes. The forkserver listens on one in multiprocessing's temp
# folder, which it makes under TMPDIR on first use: TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, 32 bytes
# more. A deep TMPDIR (a CI workspace, a test's folder under pytest-xdist) ended every run in
# "OSError: AF_UNIX path too long"; then that folder is made under /tmp (CPython 3.12+ does the same).
_SOCKET_PATH_MAX = 107
_TEMP_SOCKET_TAIL = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def _short_socket_folder() -> None:
    """multiprocessing's temp folder (made once a process) where a socket's path in it fits."""
    if len(os.fsencode(tempfile.gettempdir())) + _TEMP_SOCKET_TAIL <= _SOCKET_PATH_MAX:
        return
    chosen, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = chosen


def _context() -> multiprocessing.context.BaseContext:
    """The workers' start method: forkserver on Linux (its server imports this module once, and each
    worker forks from it), spawn elsewhere."""
    context = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
    if context.get_start_method() == "forkserver":
        _short_socket_folder()
        context.set_forkserver_preload(["itlaudit.capture.workers"])
    return context


def prestart_workers() -> None:
    """Start the forkserver now, not when the first worker is asked for: a run calls this before its
    preflight (the host's environment, the server's identity, planning), which the server's own
    interpreter start and preload import (0.1-0.25 s) then overlap instead of delaying the capture.
    Idempotent; nothing under spawn."""
    if _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def start_workers(shares: list[WorkerShare]) -> list[WorkerHandle]:
    """Start one process per share (forkserver: no locks or threads of this process are inherited,
    and after the first run a worker starts in milliseconds), measure each one's clock, then release
    them together through the barrier."""
    context = _context()
    barrier = context.Barrier(len(shares) + 1)
    handles = []
    for share in shares:
        records_in, records_out = context.Pipe(duplex=False)
        control, their_control = context.Pipe()
        process = context.Process(  # type: ignore[attr-defined]  # BaseContext lacks it in typeshed
            target=worker_main,
            args=(share, records_out, their_control, barrier),
            name=f"itlaudit-capture-{share.worker}",
            daemon=True,
        )
        process.start()
        records_out.close()
        their_control.close()
        handles.append(WorkerHandle(share, process, records_in, control))
    for handle in handles:
        handle.measure_clock()
    # One start instant on our clock, told to each worker on its own: schedule offsets then mean the same
    # moment in every worker. The margin covers the workers' last steps to the barrier.
    start_ns = time.monotonic_ns() + START_MARGIN_NS
    for handle in handles:
        handle.start_ns = start_ns + handle.clock_offset_ns
        handle.control.send(handle.start_ns)
    barrier.wait()
    return handles
