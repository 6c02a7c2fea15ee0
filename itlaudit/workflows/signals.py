"""Where a signal stops a step: every command's async step runs through `run_until_stopped`, a folder a
signal left unfinished is marked so (`mark_interrupted`), and the derivation that must not be cut in
half runs under `held_signals`. The flags themselves are model.stop's."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from itlaudit.errors import ItlauditError
from itlaudit.model.stop import check, interruption, on_second, requested
from itlaudit.store.rundir import SUMMARY_FILE

if TYPE_CHECKING:
    from itlaudit.workflows.run_folder import RunFolder

_T = TypeVar("_T")


def run_until_stopped(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run` for a step a signal must stop: a watcher polls the stop request (model.stop)
    every 50 ms and cancels the step's task, so its streams end at an await, its `finally` blocks
    stop the capture workers, and what finished stays written; then KeyboardInterrupt is raised
    here, at the step's boundary, never inside the loop's cleanup. It works off the main thread too
    (a parallel bisection's probes), where no signal handler can be installed. A signal that came
    before the step started closes its coroutine unstarted: left to the collector it printed
    "RuntimeWarning: coroutine ... was never awaited" after the interrupt's one line (a sweep cut
    between two trials, seen on a loaded box)."""
    try:
        check()
    except KeyboardInterrupt:
        main.close()
        raise

    async def watched() -> _T:
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            while not requested():
                await asyncio.sleep(0.05)
            task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            return await main
        finally:
            watcher.cancel()

    try:
        result = asyncio.run(watched())
    except asyncio.CancelledError:
        check()
        raise
    check()  # a step that ended by itself while the signal came: stopped here all the same
    return result


def mark_interrupted(folder: RunFolder, finish_with: str) -> None:
    """A folder a signal left with records and no figures, marked so in meta.json with what finishes
    it, so no reader (track add, report) takes it for a finished run: the run's own, a sweep trial
    (its --resume runs it again), a bisect trial (its --resume reruns the probe)."""
    signal_name, _ = interruption()
    folder.mark("interrupted", {"signal": signal_name, "at_unix": time.time(), "finish_with": finish_with})


@contextmanager
def held_signals(folder: RunFolder, finish_with: str) -> Iterator[None]:
    """A step that must not be cut in half, the derivation that writes summary.json and the report:
    a first SIGINT or SIGTERM is only recorded (model.stop, as everywhere), the step runs to its end
    and the caller stops at its boundary, so the folder is finished rather than half-written.

    It cannot check a flag halfway (a synchronous derivation: pandas and file writes), so its time is
    what bounds the exit: ~0.1 s for the hundreds of requests of a usual run, seconds only for runs of
    tens of thousands or replies of tens of MB. A user who will not wait sends a second signal, and
    that one ends the process at once, from the handler and without raising into whatever runs: a
    summary.json it may have cut is removed, meta.json is marked interrupted with `finish_with` (the
    one command that derives it all again from requests.jsonl), the launched servers still up (a
    sweep's or a bisect probe's) are stopped by the exit functions, and the exit code is the first
    signal's."""

    def cut(signum: int) -> None:
        signal_name, exit_code = interruption()
        with contextlib.suppress(OSError, ItlauditError):
            (folder.path / SUMMARY_FILE).unlink(missing_ok=True)
            mark_interrupted(folder, finish_with)
        line = f"itlaudit: interrupted by {signal_name} while deriving the figures: every request is kept; "
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{line}{finish_with}\n")
            sys.stderr.flush()
        atexit._run_exitfuncs()  # the launcher's: stop every server this process started
        os._exit(exit_code)

    with on_second(cut):
        yield
