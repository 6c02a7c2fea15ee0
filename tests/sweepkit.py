"""Helpers for the sweep tests (tests/test_sweep*.py): a scenario of launched simulators, `itlaudit
sweep` as a subprocess, and the one-line refusal check."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SIM = [sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--ttft-ms", "5"]


def sweep_scenario(
    tmp_path: Path, variants: dict[str, list[str]], workload: str = "", tables: str = ""
) -> Path:
    """`tables`: TOML tables after [workload] (e.g. [sweep.serve]), before the variants."""
    text = (
        'name = "simsweep"\n[workload]\nprompts = ["hello there", "speculative"]\nnum_requests = 2\n'
        f"max_tokens = 16\nignore_eos = true\ntemperature = 0\n{workload}\n{tables}\n"
    )
    for name, flags in variants.items():
        text += f'[[variants]]\nname = "{name}"\n[variants.launch]\nkind = "command"\n'
        text += f"command = {json.dumps([*SIM, *flags])}\n"
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def run_sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", "sweep", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


def wait_for(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
