"""Helpers of the end-to-end fault tests (test_faults_e2e, test_faults_capture, test_fault_campaign): the
real CLI in a fresh interpreter, a one-variant scenario file, the one-error-line check, a faultserver
launched as a user's server would be (the faultserver fixture in conftest.py starts one per test), and
the processes a run left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.launcher import LaunchedServer, launch
from itlaudit.workflows.server import RUN_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
FAULTSERVER = str(ROOT / "tests" / "faultserver.py")
UNREACHABLE = "http://127.0.0.1:9"  # never asked: the scenario is refused first
WORKLOAD = 'prompts = ["hi", "there"]\nnum_requests = 4\nconcurrency = 2\nmax_tokens = 12\ntemperature = 0'


def itlaudit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def write_scenario(
    tmp_path: Path, variants: str, workload: str = WORKLOAD, name: str = "t", endpoint: str = "completions"
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nendpoint = "{endpoint}"\n\n[workload]\n{workload}\n\n{variants}')
    return path


def url_variant(name: str, url: str) -> str:
    return f'[[variants]]\nname = "{name}"\nurl = "{url}"\n\n'


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def refused_before_any_folder(tmp_path: Path, workload: str, endpoint: str = "completions") -> str:
    """`itlaudit run` of a scenario that must be refused as it loads: one line, exit 2, within seconds,
    and nothing written beside the scenario file (its variant's URL is never asked)."""
    path = write_scenario(tmp_path, url_variant("v", UNREACHABLE), workload, endpoint=endpoint)
    started = time.monotonic()
    result = itlaudit("run", str(path), cwd=tmp_path, timeout=60)
    line = one_error_line(result)
    assert time.monotonic() - started < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    return line


def launch_faultserver(mode: str, *flags: str, log: Path) -> LaunchedServer:
    """tests/faultserver.py in MODE (extra flags after it), launched and waited for; stop() it after."""
    argv = [sys.executable, FAULTSERVER, "--port", "{port}", "--mode", mode, *flags]
    return launch(LaunchSpec(kind="command", command=argv, ready_timeout_s=30), log)


def processes_tagged(run_dir: Path) -> list[int]:
    """Live (non-zombie) processes whose environment carries this run's tag (RUN_DIR_ENV): a server
    the run launched, its capture workers."""
    tag = f"{RUN_DIR_ENV}={run_dir.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if tag in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.rpartition(")")[2].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
