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
(the run's derivation) ends the process there, with what finishes the folder said.

What a stopping command waits for (a launched server's shutdown, a build command's) is bounded by
the signal too (`end_group`): a server that ignores its SIGTERM is killed SIGNALLED_GRACE_S after the
signal, not after the graceful 10 s a normal stop gives it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import IO

# A signalled command has 5 s to exit (issue 39). What it waits for to end gracefully (a launched
# server's SIGTERM) is given until this long after the signal, then killed: the rest of the bound is
# the folder's wrap-up (the derivation and a report without plots, ~1 s on the loaded 2-core box).
SIGNALLED_GRACE_S = 3.0


@dataclass
class _Stop:
    """The first signal (its number and monotonic time), how many came, and the step's reaction to a
    second one."""

    signum: int | None = None
    at: float | None = None
    count: int = 0
    second: Callable[[int], None] | None = None


_STOP = _Stop()


def _record(signum: int, frame: FrameType | None) -> None:
    """The handler of both signals: it writes down what came and returns; nothing is raised. (Python
    runs it in the main thread between two bytecodes, so it takes no lock the main thread may hold.)"""
    _STOP.count += 1
    if _STOP.signum is None:
        _STOP.signum, _STOP.at = signum, time.monotonic()
    if _STOP.count > 1 and _STOP.second is not None:
        _STOP.second(signum)


def handle_signals() -> None:
    """Install the handler for both signals (the CLI does, once a command runs, in the main thread),
    with no signal recorded yet: the entry point's own handler (cli._stop_while_starting) took any
    that came before, and a test's in-process CLI call starts clean. SIGINT's is set explicitly: a
    script's background job (`itlaudit run … &`) inherits SIGINT ignored. Capture workers ignore
    SIGINT themselves; the coordinator decides what an interrupt ends."""
    _STOP.signum, _STOP.at, _STOP.count, _STOP.second = None, None, 0, None
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


def group_alive(pgid: int) -> bool:
    """Whether any process of that group is alive (a zombie counts until its parent reaps it)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """End a command started in a session of its own and every process of its group (a vLLM server's
    engine core, the builds pip starts): SIGTERM, up to `grace_s` for them to exit, then SIGKILL.
    After a signal the wait ends SIGNALLED_GRACE_S after it, whichever is first, also when the signal
    comes during the wait. The group is signalled even after the leader exited: orphaned children
    keep the pgid."""
    pgid = proc.pid  # start_new_session=True makes the leader's pid the pgid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < (end if _STOP.at is None else min(end, _STOP.at + SIGNALLED_GRACE_S)):
        proc.poll()  # reap the leader so it doesn't linger as a zombie group member
        if not group_alive(pgid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run_stoppable(argv: list[str], stdout: IO[bytes] | int, stderr: int = subprocess.STDOUT) -> int:
    """A command's exit code (a bisect build step: minutes of pip; a docker pull), or, when a signal
    comes first, the command's whole process group ended (`end_group`, 2 s of grace: it runs in a
    session of its own, so the processes it started, pip's builds, end with it) and
    KeyboardInterrupt raised: from any thread, so a prefetching thread's command does not hold the
    exit until it ends by itself. OSError (it could not start) is the caller's to name."""
    proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, start_new_session=True)
    while (code := proc.poll()) is None:
        if requested():
            end_group(proc, 2.0)
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
