"""Prepare builds in the background while a probe runs (mozregression downloads both possible next
midpoints during a test). One worker: installs are disk- and network-bound, and two at once would
only slow the one the search needs next."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import Prepared, Provider
from itlaudit.model.stop import check


class Prefetcher:
    def __init__(self, provider: Provider, *, background: bool) -> None:
        self.provider = provider
        self.background = background and provider.prefetchable
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="itlaudit-prefetch")
        self._futures: dict[str, Future[Prepared]] = {}

    def _submit(self, build: Build) -> Future[Prepared]:
        if build.ref not in self._futures:
            self._futures[build.ref] = self._pool.submit(self.provider.prepare, build)
        return self._futures[build.ref]

    def want(self, builds: list[Build]) -> None:
        """Start preparing builds that may be probed next; a no-op unless prefetching is on."""
        if self.background:
            for build in builds:
                self._submit(build)

    def get(self, build: Build) -> Prepared:
        """The prepared build, waiting for a prefetch in flight; raises what prepare raised. The wait
        is polled, so a signal (model.stop) ends it within 50 ms, whatever the install has left."""
        future = self._submit(build)
        while True:
            try:
                return future.result(timeout=0.05)
            except TimeoutError:
                check()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
