"""Run a set-up command with its output appended to a log, so a failure can point at the whole story."""

from __future__ import annotations

from pathlib import Path

from itlaudit.model.stop import run_stoppable


def run_logged(argv: list[str], log_path: Path) -> int:
    """The command's exit code; OSError (it could not start) is left to the caller to name. A signal
    (model.stop) ends it and raises KeyboardInterrupt within the 5 s an interrupt has: a bisect
    build's pip install or a testbed's takes minutes, and waiting for it held the exit that long.
    The command runs in a session of its own, and the stop ends its whole process group: the
    builds pip starts (a wheel's setup.py, a compiler) are ended with it."""
    with log_path.open("ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        return run_stoppable(argv, log)
