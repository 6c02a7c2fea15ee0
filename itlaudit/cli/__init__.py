"""The `itlaudit` command line: one module per command group, each a thin wrapper over workflows."""

import os
import signal
import threading
from types import FrameType

__all__ = ["main"]


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGINT or SIGTERM before the command's own handlers are in (model.stop.handle_signals, from the
    CLI's callback): nothing has started, so nothing to keep; one line and the signal's exit code.
    Without it a script's background job, which inherits SIGINT ignored, lost a Ctrl-C sent while the
    CLI was still importing, and ran to the end (issue 39 item 1)."""
    os.write(2, f"itlaudit: interrupted by {signal.Signals(signum).name} while starting\n".encode())
    os._exit(128 + signum)


def main() -> None:
    """The console script's entry point (pyproject's `itlaudit.cli:main`, and `python -m itlaudit`).
    The signals are taken first, then the CLI is imported: it is imported when it runs, not with this
    package: a capture worker (forkserver) re-runs the script's module-level code, which imports this
    package, before its target, and must not load the whole CLI to do so."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop_while_starting)
    from itlaudit.cli.app import main as run

    run()
