"""A venv per build, installed by pip through subprocesses: vLLM never enters itlaudit's environment.

Shared by the wheels and pip providers, which differ only in what they ask pip for and how they
check that the result is the build they meant.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from itlaudit.errors import BuildUnavailable
from itlaudit.serve.logged import run_logged

INSTALL_LOG = "install.log"


def _run(step: str, argv: list[str], log_path: Path) -> None:
    try:
        returncode = run_logged(argv, log_path)
    except OSError as exc:
        raise BuildUnavailable(f"{step} could not start ({exc}); see {log_path}") from None
    if returncode != 0:
        raise BuildUnavailable(f"{step} failed (exit {returncode}); see {log_path}")


def install(
    root: Path, requirements: list[str], *, pip_args: list[str], fixups: list[str], label: str
) -> Path:
    """Create root/venv, pip install the requirements, then run each fix-up (`{python}` is the venv's
    interpreter, split on spaces); returns the interpreter. Any failure means the build is unavailable."""
    log_path = root / INSTALL_LOG
    env_dir = root / "venv"
    root.mkdir(parents=True, exist_ok=True)
    # `python -m venv` as a command, not venv.create: its ensurepip takes seconds, and only a command
    # run_logged waits for can be ended by a signal.
    _run(f"{label}: creating a venv in {env_dir}", [sys.executable, "-m", "venv", str(env_dir)], log_path)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run(f"{label}: pip install", [*pip, "install", *pip_args, *requirements], log_path)
    for fixup in fixups:
        argv = [part.replace("{python}", str(python)) for part in fixup.split()]
        _run(f"{label}: post-install {fixup!r}", argv, log_path)
    return python


def dist_version(python: Path, dist: str, log_path: Path) -> str:
    """The installed version as the venv itself reports it (pip's own view can differ from intent)."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        with log_path.open("a") as log:
            log.write(result.stderr)
        raise BuildUnavailable(f"{dist} is not importable after install; see {log_path}")
    return result.stdout.strip()
