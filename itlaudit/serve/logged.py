"""Run a set-up command with its output appended to a log, so a failure can point at the whole story."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["run_logged"]


def run_logged(argv: list[str], log_path: Path) -> int:
    """The command's exit code; OSError (it could not start) is left to the caller to name."""
    with log_path.open("ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
