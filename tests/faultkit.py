"""Helpers of the end-to-end fault tests (test_faults_e2e, test_faults_capture): the real CLI in a fresh
interpreter, a one-variant scenario file, and the one-error-line check. The faultserver fixture that
launches tests/faultserver.py is in conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTSERVER = str(ROOT / "tests" / "faultserver.py")
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


def write_scenario(tmp_path: Path, variants: str, workload: str = WORKLOAD, name: str = "t") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nendpoint = "completions"\n\n[workload]\n{workload}\n\n{variants}')
    return path


def url_variant(name: str, url: str) -> str:
    return f'[[variants]]\nname = "{name}"\nurl = "{url}"\n\n'


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]
