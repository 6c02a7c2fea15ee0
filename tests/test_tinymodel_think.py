"""The thinking model's build step (tinymodel.py --arch think through testbed.build_model): its own folder
and marker, and the random Llama's folders left standing. The walk itself is checked by the builder
before it writes (tinymodel._check_walk) and on the wire by tests/test_reasoning_vllm.py.

CI cost: well under a second (the testbed python is a shell script that records its arguments)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from itlaudit.cli.testbed import default_model_dir
from itlaudit.serve.testbed import MODEL_MARKER, build_model


@pytest.fixture
def recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in testbed python that appends its arguments to a file, so each build is one line."""
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python, calls


def test_the_thinking_model_is_its_own_build(recording_python: tuple[Path, Path], tmp_path: Path) -> None:
    python, calls = recording_python
    out = tmp_path / "think"
    build_model(out, python=python, arch="think")
    build_model(out, python=python, arch="think")  # built the same way: skipped
    (line,) = calls.read_text().splitlines()
    assert line.startswith("-P ") and line.endswith(f"tinymodel.py {out} --seed 0 --arch think")
    assert json.loads((out / MODEL_MARKER).read_text())["arch"] == "think"
    build_model(out, python=python)  # a random Llama asked into the same folder: rebuilt
    assert calls.read_text().splitlines()[-1].endswith(f"{out} --seed 0")


def test_a_llama_folder_built_before_the_thinking_model_stands(
    recording_python: tuple[Path, Path], tmp_path: Path
) -> None:
    """The Llama's marker keeps the keys it had, so the shared cache's tiny-llama-s0 is not rebuilt
    under a server another test module is loading."""
    python, calls = recording_python
    out = tmp_path / "llama"
    out.mkdir()
    (out / MODEL_MARKER).write_text(json.dumps({"seed": 0, "draft_noise": None, "builder": "tinymodel.py"}))
    assert build_model(out, python=python) == out
    assert not calls.exists()


def test_the_shared_cache_names_each_tiny_model() -> None:
    assert default_model_dir().name == "tiny-llama-s0"
    assert default_model_dir(1, 0.5).name == "tiny-llama-s1-noise0.5"
    assert default_model_dir(arch="think").name == "tiny-think-s0"
