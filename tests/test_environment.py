"""The environment record: what is recorded, what is redacted, and that every run carries it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from simkit import sim_server

from itlaudit.capture.server_info import server_environment
from itlaudit.model.scenario import parse_scenario
from itlaudit.serve import environment
from itlaudit.serve.environment import (
    commit_of,
    non_default_args,
    recorded_env,
    server_env,
)
from itlaudit.serve.sim import SIM_VERSION, SimConfig
from itlaudit.workflows.run import run_scenario

LOG_LINE = (
    "(APIServer pid=18744) INFO 12-02 17:13:27 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
    "'model': '/m', 'enforce_eager': True, 'override_generation_config': {'max_new_tokens': 128}}\n"
)


def test_engine_env_is_kept_and_secrets_redacted() -> None:
    env = {
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
        "CUTE_DSL_ARCH": "sm_121a",
        "VLLM_API_KEY": "s3cret",
        "HOME": "/r",
    }
    assert recorded_env(env) == {
        "CUTE_DSL_ARCH": "sm_121a",
        "VLLM_API_KEY": "***",
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
    }


def test_docker_server_sees_only_its_own_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_FROM_SHELL", "1")
    assert server_env({"VLLM_X": "2"}, "docker") == {"VLLM_X": "2"}
    assert server_env({"VLLM_X": "2"}, "python") == {"VLLM_FROM_SHELL": "1", "VLLM_X": "2"}


def test_commit_comes_from_a_nightly_version() -> None:
    assert commit_of("0.23.1rc1.dev601+ga16dbd5b8") == "a16dbd5b8"
    assert commit_of("0.23.1rc1.dev601+ga16dbd5b8.cu130") == "a16dbd5b8"
    assert commit_of("0.32.0") is None
    assert commit_of(None) is None


def test_non_default_args_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("starting\n" + LOG_LINE)
    assert non_default_args(log) == {
        "host": "127.0.0.1",
        "model": "/m",
        "enforce_eager": True,
        "override_generation_config": {"max_new_tokens": 128},
    }
    assert non_default_args(tmp_path / "missing.log") is None


def test_gpus_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    out = "NVIDIA GB10, 12.1, 580.95\n"
    monkeypatch.setattr(
        environment.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out, stderr=""),
    )
    assert environment.gpus() == [{"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95"}]
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    assert environment.gpus() is None


def test_server_record_from_a_live_server() -> None:
    config = SimConfig()
    with sim_server(config) as url:
        record = server_environment(url, [config.system_fingerprint, None])
    assert record["server_version"] == SIM_VERSION and record["simulated"] is True
    assert record["vllm_version"] is None and record["vllm_commit"] is None  # the simulator is not vLLM
    assert record["system_fingerprint"] == config.system_fingerprint
    assert record["launched"] is False and record["env"] is None


def test_every_run_meta_carries_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("itlaudit.report.plots.write_plots", lambda views, out_dir, **options: [])
    text = """name = "env"
[workload]
prompts = ["hi"]
max_tokens = 4
[[variants]]
name = "A"
"""
    config = SimConfig(step_ms=0, ttft_ms=0)
    with sim_server(config) as url:
        run_scenario(parse_scenario(text, tmp_path / "env.toml"), url=url, run_dir=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["environment"]["cpu_architecture"]
    assert meta["environment"]["itlaudit_version"]
    assert meta["variants"]["A"]["environment"]["system_fingerprint"] == config.system_fingerprint
