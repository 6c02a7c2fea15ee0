"""The capture loop's self-audit: how late the loop ran what was due while streams were open.

A ticker every `TICK_S` measures its own lateness, as every loop-lag probe does, with one correction
that matters at this scale: the poll's timeout is rounded up to whole milliseconds, so an idle loop's
1 ms timer already fires up to 1 ms late — twenty times the 5% of a 2 ms ITL that `client_saturated`
must notice — although a socket that became readable meanwhile would have woken it at once. So the
selector notes when each poll starts and returns: a tick that fell due while the loop was polling
counts its lateness from the poll's return (the rounding is excused), one that fell due while the loop
was busy counts from its due time. Either way what is left is the time the loop spent on other
callbacks before it got to the tick, which is what a chunk that arrived at the tick's due time would
have waited for its stamp (the tick runs after that poll's I/O callbacks, so the figure errs high).

The samples are a plain list; a record names the positions covering its stream, and the records writer
thread turns that window into p99 and max, so nothing is computed on the loop.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any

TICK_S = 0.001


class _TimedSelector(selectors.DefaultSelector):
    """The platform's default selector, noting when its last poll started and returned."""

    def __init__(self) -> None:
        super().__init__()
        self.entered_ns = self.returned_ns = time.monotonic_ns()

    def select(self, timeout: float | None = None) -> Any:
        self.entered_ns = time.monotonic_ns()
        ready = super().select(timeout)
        self.returned_ns = time.monotonic_ns()
        return ready


class LagProbe:
    """One lateness sample (ms) per tick; see the module docstring."""

    def __init__(self, selector: _TimedSelector) -> None:
        self._selector = selector
        self.samples_ms: list[float] = []
        self._handle: asyncio.TimerHandle | None = None

    def position(self) -> int:
        return len(self.samples_ms)

    def start(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now_ns = time.monotonic_ns()
        due_ns = int(self._handle.when() * 1e9) if self._handle is not None else now_ns
        selector = self._selector
        since_ns = due_ns if due_ns < selector.entered_ns else max(due_ns, selector.returned_ns)
        self.samples_ms.append((now_ns - since_ns) / 1e6)
        self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def window(self, start: int, end: int) -> tuple[float | None, float | None]:
        """p99 (numpy's default, linear between closest ranks) and max of the samples in [start, end)
        (the stream's lifetime). It runs on the records writer thread, which shares the worker's GIL
        with the loop: a sort of plain floats holds it a quarter as long as numpy's percentile did
        (21 against 80 µs for a one-second stream)."""
        samples = sorted(self.samples_ms[start : max(end, start + 1)])
        if not samples:
            return None, None
        rank = 0.99 * (len(samples) - 1)
        below = int(rank)
        above = min(below + 1, len(samples) - 1)
        p99 = samples[below] + (samples[above] - samples[below]) * (rank - below)
        return p99, samples[-1]


def new_capture_loop() -> tuple[asyncio.AbstractEventLoop, LagProbe]:
    """An event loop whose selector the probe can read. uvloop is not used: its libuv poll cannot be
    timed this way, and it measured no gain here (docs/capture.md, "The capture path")."""
    selector = _TimedSelector()
    loop = asyncio.SelectorEventLoop(selector)
    return loop, LagProbe(selector)
