"""The stop request: SIGINT and SIGTERM recorded as state, never raised where they land.

A handler that raises KeyboardInterrupt raises it inside whatever Python runs at that moment, and when
that is cleanup code (a `__del__`, a weakref callback, a `finally` stopping a server) Python drops
it ("Exception ignored … KeyboardInterrupt"): the fourth fault campaign saw a sweep run to the end and
exit 0 after its SIGINT (issue 39 item 1). Here a signal only records itself. Each step checks the
record at its boundaries (`check`, which raises KeyboardInterrupt there, in the step's own code), a
blocking wait polls it (the launcher's readiness loop, a bisect build command), and an event loop
is woken by a watcher that cancels its main task (workflows.run.run_until_stopped). The CLI checks
once more when a command returns, so a signal that came after the last boundary still ends in
130/143: none is lost.

One step reacts at once instead (`on_second`): a second signal during a step that holds the first
(the run's derivation) ends the process there, with what finishes the folder said."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["check", "handle_signals", "interruption", "on_second", "requested", "wait_for", "wait_or_stop"]


@dataclass
class _Stop:
    """The first signal (its number), how many came, and the step's reaction to a second one."""

    signum: int | None = None
    count: int = 0
    second: Callable[[int], None] | None = None


_STOP = _Stop()


def _record(signum: int, frame: FrameType | None) -> None:
    """The handler of both signals: it writes down what came and returns; nothing is raised. (Python
    runs it in the main thread between two bytecodes, so it takes no lock the main thread may hold.)"""
    _STOP.count += 1
    if _STOP.signum is None:
        _STOP.signum = signum
    if _STOP.count > 1 and _STOP.second is not None:
        _STOP.second(signum)


def handle_signals() -> None:
    """Install the handler for both signals (the CLI does, once a command runs, in the main thread),
    with no signal recorded yet: the entry point's own handler (cli._stop_while_starting) took any
    that came before, and a test's in-process CLI call starts clean. SIGINT's is set explicitly: a
    script's background job (`itlaudit run … &`) inherits SIGINT ignored. Capture workers ignore
    SIGINT themselves; the coordinator decides what an interrupt ends."""
    _STOP.signum, _STOP.count, _STOP.second = None, 0, None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _record)


def requested() -> bool:
    """Whether a signal asked this process to stop."""
    return _STOP.signum is not None


def check() -> None:
    """A step's boundary: stop here, in the step's own code, if a signal came (KeyboardInterrupt,
    which each command turns into its interrupted wrap-up and 130/143)."""
    if _STOP.signum is not None:
        raise KeyboardInterrupt


def wait_or_stop(seconds: float) -> None:
    """A blocking wait's sleep (a readiness poll, a build command's): at most `seconds`, cut short
    and raised at once (as `check`) when a signal comes; 50 ms slices, so the 5 s bound holds."""
    end = time.monotonic() + seconds
    while True:
        check()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def wait_for(proc: subprocess.Popen[bytes]) -> int:
    """A command's exit code (a bisect build step: minutes of pip), or, when a signal comes first,
    the command terminated (killed 2 s on) and KeyboardInterrupt raised: from any thread, so a
    prefetching thread's command does not hold the exit until it ends by itself."""
    while (code := proc.poll()) is None:
        if requested():
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            check()
        time.sleep(0.05)
    return code


def interruption() -> tuple[str, int]:
    """What stopped the command, as (signal name, exit code): SIGTERM 143, otherwise SIGINT 130 (a
    KeyboardInterrupt no handler recorded is a Ctrl-C in a test or before the handler was in)."""
    return ("SIGTERM", 143) if _STOP.signum == signal.SIGTERM else ("SIGINT", 130)


@contextmanager
def on_second(react: Callable[[int], None]) -> Iterator[None]:
    """While in the block, a signal after the first calls `react` (from the handler, which must end
    the process: the block is a step that holds the first signal and cannot be cut in half)."""
    before, _STOP.second = _STOP.second, react
    try:
        yield
    finally:
        _STOP.second = before
