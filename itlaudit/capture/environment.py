"""Where a capture's workers run, chosen once: processes on this machine or actors on a Ray cluster.

Both run the same shares through the same worker code and land the same JSON lines; what differs is
how many CPUs `--workers auto` may fill, what to start early, and how the workers are started, watched
and ended. That difference is one interface (`CaptureEnvironment`, as guidellm's Environment is to its
benchmarks), and `capture_environment` is the one place that picks an implementation from the capture
options' `cluster`: the capture and the command's preflight ask it instead of testing for Ray.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from itlaudit.capture.described import CaptureDescription
from itlaudit.capture.workers import WorkerHandle, WorkerShare, available_cores, start_workers
from itlaudit.errors import CaptureWorkerError
from itlaudit.model.records import RequestRecord

if TYPE_CHECKING:
    from types import ModuleType

OnDescribed = Callable[[CaptureDescription], None]
_READ_SIZE = 1 << 16


class Lander(Protocol):
    """What the coordinator lands records through (`capture.runner.RecordLander`)."""

    def feed(self, worker: int, data: bytes) -> None: ...

    def add(self, record: RequestRecord) -> None: ...

    @property
    def records(self) -> list[RequestRecord]: ...


class CaptureEnvironment(Protocol):
    """Where the workers of a capture run."""

    def prepare(self) -> None:
        """Start what can start before the preflight (blocking, quick): it then overlaps that work."""

    async def cores(self, requested: int | None) -> int:
        """The CPUs `--workers auto` stays within; an explicit count they cannot hold is refused here."""

    async def run(
        self,
        shares: list[WorkerShare],
        lander: Lander,
        described: CaptureDescription,
        on_capture: OnDescribed,
    ) -> None:
        """Run the shares to their end, landing every line, and tell `on_capture` the workers as
        meta.json describes them (with `described` merged in)."""


class LocalProcesses:
    """One process per share on this machine; a worker that dies stops the run (its finished records
    are kept)."""

    def prepare(self) -> None:
        from itlaudit.capture.workers import prestart_workers

        prestart_workers()

    async def cores(self, requested: int | None) -> int:
        return available_cores()

    async def run(
        self,
        shares: list[WorkerShare],
        lander: Lander,
        described: CaptureDescription,
        on_capture: OnDescribed,
    ) -> None:
        loop = asyncio.get_running_loop()
        handles = await loop.run_in_executor(None, start_workers, shares)
        on_capture({"workers": [h.describe() for h in handles], **described})
        try:
            await asyncio.gather(*(_collect(handle, lander) for handle in handles))
            for handle in handles:
                await loop.run_in_executor(None, handle.process.join)
                if handle.process.exitcode != 0:
                    raise CaptureWorkerError(
                        f"capture worker {handle.share.worker} exited with code {handle.process.exitcode} "
                        f"after {sum(r.worker == handle.share.worker for r in lander.records)} of its "
                        f"{len(handle.share.plans)} requests; the finished ones are kept in requests.jsonl"
                    )
        finally:
            for handle in handles:
                if handle.process.is_alive():
                    handle.process.kill()
                handle.records_in.close()
                handle.control.close()


@dataclass
class RayCluster:
    """One Ray actor per share, spread over the cluster's nodes (capture/cluster.py); joined on first
    use, off the event loop, and Ray is imported only then."""

    address: str  # "auto" or "ray://HOST:PORT"

    def prepare(self) -> None:
        """Nothing to start early: the actors start on the cluster."""

    async def _ray(self) -> ModuleType:
        from itlaudit.capture.cluster import connect

        return await asyncio.get_running_loop().run_in_executor(None, connect, self.address)

    async def cores(self, requested: int | None) -> int:
        from itlaudit.capture.cluster import usable_cpus

        return usable_cpus(await self._ray(), requested)

    async def run(
        self,
        shares: list[WorkerShare],
        lander: Lander,
        described: CaptureDescription,
        on_capture: OnDescribed,
    ) -> None:
        from itlaudit.capture.cluster import capture_on_ray

        await capture_on_ray(await self._ray(), shares, lander, described, on_capture)


def capture_environment(cluster: str | None) -> CaptureEnvironment:
    """The one choice between this machine and a Ray cluster (`cluster` as CaptureOptions holds it:
    None, "auto" or "ray://HOST:PORT")."""
    return LocalProcesses() if cluster is None else RayCluster(cluster)


async def _collect(handle: WorkerHandle, lander: Lander) -> None:
    """Land the worker's JSON lines as they come, read on this loop when its pipe is readable."""
    loop = asyncio.get_running_loop()
    fd = handle.records_in.fileno()
    finished = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, _READ_SIZE)
            if not data:
                finished.set_result(None)
                return
            lander.feed(handle.share.worker, data)
        except BaseException as exc:  # surfaced by the awaiting coroutine, not lost in a callback
            if not finished.done():
                finished.set_exception(exc)

    loop.add_reader(fd, readable)
    try:
        await finished
    finally:
        loop.remove_reader(fd)
