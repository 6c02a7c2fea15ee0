"""The shipped CPU smoke suite against real vLLM 0.32.0 CPU servers: it must say GO.

Two server starts (~50 s each on 2 cores) plus the suite's runs; opt-in with --vllm.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from vllm_server import tiny_model

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parent.parent
ITLAUDIT = str(Path(sys.executable).with_name("itlaudit"))


def test_cpu_suite_is_go_on_the_real_testbed(tmp_path: Path) -> None:
    tiny_model()  # installs the testbed and builds the model the suite's {cache} paths name
    junit = tmp_path / "ci.xml"
    started = time.monotonic()
    result = subprocess.run(
        [
            ITLAUDIT,
            "smoke",
            "--suite",
            str(ROOT / "scenarios/smoke/cpu"),
            "--out",
            str(tmp_path / "out"),
            "--junit",
            str(junit),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    assert int(suite.get("tests", "0")) >= 20
    assert "GO: " in result.stdout
    print(result.stdout, f"wall {elapsed:.0f} s")
