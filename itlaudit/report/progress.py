"""What a long command shows while it works: on a terminal, rich's live display (a bar for a capture,
a spinner named after the step for derivation, plots and the report); without one (a CI log, nohup, a
pipe), plain lines, flushed: one per phase and a heartbeat whenever nothing was printed for
`period_s` (10 s by default), so a log is never silent long enough to look hung.

The reporter lives in the coordinator. Capture happens in worker processes; the coordinator's
per-record callback only moves counters here, and the heartbeat is a thread that wakes once a period,
so nothing of this runs on a loop that stamps chunks.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from itlaudit.model.redact import redact_url

DEFAULT_PERIOD_S = 10.0
# Overrides the heartbeat period (seconds): the tests use it so as not to wait 10 s for a line.
PERIOD_ENV = "ITLAUDIT_PROGRESS_PERIOD_S"


def duration(seconds: float) -> str:
    """`1:05` or `1:02:03`, as rich's elapsed column shows it."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _period_from_env() -> float:
    raw = os.environ.get(PERIOD_ENV)
    try:
        value = float(raw) if raw else DEFAULT_PERIOD_S
    except ValueError:
        return DEFAULT_PERIOD_S
    return value if value > 0 else DEFAULT_PERIOD_S


@dataclass
class CaptureProgress:
    """Counters of a capture (requests landed of `total`; the tokens they carried, per variant for the
    rate) and the line they make. Moved by the coordinator's record callback, read by the display:
    plain ints, no lock needed."""

    description: str
    total: int
    done: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    rate_started: float = field(default_factory=time.monotonic)
    preparing: str | None = None  # what the variant does before its first request, and how far

    def begin(self, description: str, total: int | None = None) -> None:
        """A new variant (or trial): its name, its own count of `total` requests (the run's until
        then), and its own tokens/s and ETA from now (its server, if any, has started by now)."""
        self.description = description
        self.preparing = None
        self.tokens = 0
        if total is not None:
            self.total, self.done = total, 0
        self.started = self.rate_started = time.monotonic()

    def sending(self) -> None:
        """The variant's requests go out now: its ETA counts from here, not from its preparation
        (encoding bodies, the model lookup) or its server's start."""
        self.started = self.rate_started = time.monotonic()

    def prepare(self, what: str, done: int, total: int) -> None:
        """Preparation's progress (capture's OnPrepare), shown beside the name until a record lands."""
        self.preparing = f"{what} {done}/{total}"

    def shown(self) -> str:
        return f"{self.description} ({self.preparing})" if self.preparing else self.description

    def landed(self) -> None:
        self.preparing = None
        self.done += 1

    def add_tokens(self, tokens: int) -> None:
        self.tokens += tokens

    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self.rate_started
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def eta(self) -> str:
        if self.done >= self.total:
            return "0:00"
        if not self.done:
            return "?"
        elapsed = time.monotonic() - self.started
        return duration(elapsed / self.done * (self.total - self.done))

    def line(self) -> str:
        return (
            f"{self.shown()}: {self.done}/{self.total} requests, {self.tokens_per_s():.0f} tokens/s, "
            f"elapsed {duration(time.monotonic() - self.started)}, ETA {self.eta()}"
        )


class Reporter:
    """One per command. `phase` prints a line now; `step` names what blocks (a spinner, or a line and
    heartbeats); `capture` counts requests (a bar, or heartbeats). `live` is whether the console is a
    terminal; `period_s` the heartbeat period of plain mode (ITLAUDIT_PROGRESS_PERIOD_S, else 10 s)."""

    def __init__(self, console: Console | None = None, period_s: float | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal and not self.console.is_dumb_terminal
        self.period_s = period_s if period_s is not None else _period_from_env()
        self._status: Callable[[], str] | None = None
        self._last = time.monotonic()
        self._counts: CaptureProgress | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._lock = threading.Lock()

    def phase(self, text: str) -> None:
        """A line in both modes (above the bar on a terminal); a URL in it loses its userinfo."""
        with self._lock:
            self.console.print(redact_url(text), markup=False, highlight=False, soft_wrap=True)
            self.console.file.flush()
            self._last = time.monotonic()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """`name` while the block runs: a spinner on a terminal, else "name…" and a heartbeat with the
        time spent so far. Inside a capture's bar (a terminal) the bar's description says it instead."""
        started = time.monotonic()
        if self.live:
            if self._counts is not None:  # the bar's description names the step meanwhile
                before = self._counts.description
                self._counts.description = f"{name}…"
                try:
                    yield
                finally:
                    self._counts.description = before
                return
            with self.console.status(f"{name}…"):
                yield
            return
        self.phase(f"{name}…")
        with self._heartbeat(lambda: f"{name}… ({duration(time.monotonic() - started)})"):
            yield

    @contextmanager
    def watch(self, status: Callable[[], str]) -> Iterator[None]:
        """A long phase that prints its own lines now and then (a bisection's probes): `status()` on a
        spinner kept current, or as the heartbeat of a log."""
        if not self.live:
            with self._heartbeat(status):
                yield
            return
        stop = threading.Event()
        with self.console.status(status()) as spinner:

            def refresh() -> None:
                while not stop.wait(0.5):
                    spinner.update(status())

            thread = threading.Thread(target=refresh, name="progress", daemon=True)
            thread.start()
            try:
                yield
            finally:
                stop.set()
                thread.join()

    @contextmanager
    def capture(self, description: str, total: int) -> Iterator[CaptureProgress]:
        """Counters for a capture of `total` requests; set `.description` as it moves on."""
        counts = CaptureProgress(description, total)
        if not self.live:
            with self._heartbeat(counts.line):
                yield counts
            return
        bar = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        task = bar.add_task(description, total=total, rate="")
        stop = threading.Event()

        def refresh() -> None:
            while not stop.wait(0.5):
                self._refresh(bar, task, counts)

        thread = threading.Thread(target=refresh, name="progress", daemon=True)
        self._counts = counts
        with bar:
            thread.start()
            try:
                yield counts
            finally:
                stop.set()
                thread.join()
                self._counts = None

    @staticmethod
    def _refresh(bar: Progress, task: TaskID, counts: CaptureProgress) -> None:
        bar.update(
            task,
            total=counts.total,
            completed=counts.done,
            description=redact_url(counts.shown()),
            rate=f"{counts.tokens_per_s():.0f} tok/s",
        )

    @contextmanager
    def _heartbeat(self, status: Callable[[], str]) -> Iterator[None]:
        """Plain mode: `status()` whenever nothing was printed for a period. Nested (a step inside a
        capture) the inner status is shown until the block ends."""
        outer = self._status
        self._status = status
        try:
            if self._ticker is None:
                self._stop.clear()
                self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
                self._ticker.start()
            yield
        finally:
            self._status = outer
            if outer is None and self._ticker is not None:
                self._stop.set()
                # Not alive: a signal cut start() short (join() would refuse it); if it runs after
                # all, the stop event ends it at its first wait.
                if self._ticker.is_alive():
                    self._ticker.join()
                self._ticker = None

    def _tick(self) -> None:
        while True:
            wait = max(0.05, self._last + self.period_s - time.monotonic())
            if self._stop.wait(wait):
                return
            status = self._status
            if status is not None and time.monotonic() - self._last >= self.period_s:
                self.phase(status())
