"""The /metrics sampler: a thread in the coordinator process that scrapes a server's /metrics on a fixed
period while a variant's measured requests stream, writing server_metrics.jsonl
(analysis/server_metrics.py says what a row holds).

It sits outside the capture loops by construction: the capture workers are other processes, and this
thread only shares the coordinator's interpreter, whose loop lands records and stamps nothing. A
scrape costs the server one small GET a period (vLLM renders /metrics from its own process, off the
engine's step loop), and the fidelity benchmark is run with it on and off (docs/server-metrics.md).
Every scrape is best effort: a failed one is a row with `error`; a server with no /metrics at all
(three failures before any page) is given up on, in one row, and the run goes on.
"""

from __future__ import annotations

import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

from itlaudit.analysis.server_metrics import Scrape, delta_row, parse_scrape
from itlaudit.errors import MetricsParseError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.formats import stamped
from itlaudit.store.jsonl import RecordWriter

__all__ = ["DEFAULT_PERIOD_S", "MetricsSampler"]

DEFAULT_PERIOD_S = 1.0
_GIVE_UP_AFTER = 3  # failures before the first page: the server has no /metrics


class MetricsSampler:
    """start() before the measured window, stop() after it: a baseline scrape, one a period, a last
    one at stop, so the rows' deltas cover the whole window. `path` is appended to (a run's variants
    share one file; each row names its variant); a new file starts with a header line carrying the
    format version and the period."""

    def __init__(
        self,
        base_url: str,
        path: Path,
        variant: str,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        access: Access = NO_ACCESS,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/metrics"
        self.path = path
        self.variant = variant
        self.period_s = period_s
        self.access = access
        self.rows = 0  # rows written with figures (errors not counted)
        self.gave_up: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer: RecordWriter | None = None
        self._before: Scrape | None = None
        self._failures = 0

    def start(self) -> None:
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        self._writer = RecordWriter(self.path)
        if new_file:
            self._writer.write(stamped({"file": "server_metrics", "clock": "monotonic_ns"}))
        self._writer.write(
            {"variant": self.variant, "period_s": self.period_s, "url": self.url, "start": True}
        )
        self._scrape()  # the baseline, before start() returns: the window's first request comes after it
        self._thread = threading.Thread(target=self._loop, name=f"metrics:{self.variant}", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop, take the last scrape, close the file; what meta.json records of the sampling."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self.gave_up is None:
                self._scrape()
        if self._writer is not None:
            self._writer.close()
        return {"file": self.path.name, "period_s": self.period_s, "rows": self.rows, "gave_up": self.gave_up}

    def _loop(self) -> None:
        # Scrapes are due at fixed times from the start, so a slow one does not shift the ones after.
        due = time.monotonic()
        while self.gave_up is None:
            due += self.period_s
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._scrape()

    def _scrape(self) -> None:
        assert self._writer is not None
        t_ns = time.monotonic_ns()
        try:
            with self.access.urlopen(self.url, max(self.period_s, 1.0)) as resp:
                text = resp.read().decode("utf-8", errors="replace")
            now = parse_scrape(text)
        except (urllib.error.URLError, OSError, MetricsParseError) as exc:
            self._failures += 1
            error = f"GET {self.url} failed: {exc}"
            if self._before is None and self._failures >= _GIVE_UP_AFTER:
                self.gave_up = error
            self._writer.write({"t_ns": t_ns, "variant": self.variant, "error": error})
            return
        self._writer.write(delta_row(t_ns, self.variant, now, self._before))
        self._before = now
        self.rows += 1
