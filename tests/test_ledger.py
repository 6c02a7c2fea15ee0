"""Experiment ledger: fingerprints, the refusal of repeats, --force, and the printed matrix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from simkit import itlaudit, sim_server

from itlaudit.errors import DuplicateRunError
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.scenario import Variant, parse_scenario
from itlaudit.serve.sim import SimConfig
from itlaudit.store import ledger
from itlaudit.workflows.run import run_scenario

SCENARIO = """
name = "ledger-test"
endpoint = "completions"
model = "auto"

[workload]
prompts = ["The quick brown fox", "Once upon a time"]
num_requests = 2
max_tokens = 8
temperature = 0

[[variants]]
name = "K0"
url = "{url}"
"""
SERVER = {"version": "0.32.0", "system_fingerprint": "vllm-0.32.0-67068cd2"}


def _scenario(tmp_path: Path, url: str = "http://127.0.0.1:1") -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.format(url=url))
    return path


def _launched(tmp_path: Path, server_args: list[str], env: dict[str, str] | None = None):
    scenario = parse_scenario(SCENARIO.format(url="http://x"), tmp_path / "s.toml")
    launch = LaunchSpec(kind="python", python="/venv/bin/python", model="/m", server_args=server_args)
    variant = Variant(name="K0", launch=replace(launch, env=env or {}))
    return replace(scenario, variants=[variant])


def test_fingerprint_covers_build_args_env_and_workload(tmp_path: Path) -> None:
    base = ledger.variant_fingerprint(_launched(tmp_path, ["--enforce-eager"]), "K0", SERVER, {})
    same = ledger.variant_fingerprint(_launched(tmp_path, ["--enforce-eager"]), "K0", SERVER, {"HOME": "/x"})
    assert base.digest == same.digest  # unrelated environment does not make a new experiment
    others = [
        ledger.variant_fingerprint(_launched(tmp_path, []), "K0", SERVER, {}),
        ledger.variant_fingerprint(
            _launched(tmp_path, ["--enforce-eager"]), "K0", SERVER, {"VLLM_BATCH_INVARIANT": "1"}
        ),
        ledger.variant_fingerprint(
            _launched(tmp_path, ["--enforce-eager"], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}), "K0", SERVER
        ),
        ledger.variant_fingerprint(
            _launched(tmp_path, ["--enforce-eager"]), "K0", {**SERVER, "system_fingerprint": "vllm-0.33.0-1"}
        ),
    ]
    assert len({base.digest, *(f.digest for f in others)}) == 5
    workload = _launched(tmp_path, ["--enforce-eager"])
    workload = replace(workload, workload=replace(workload.workload, num_requests=99))
    assert ledger.variant_fingerprint(workload, "K0", SERVER).digest != base.digest


def test_version_is_recovered_from_system_fingerprint() -> None:
    assert ledger.version_from_system_fingerprint("vllm-0.32.0-67068cd2") == "0.32.0"
    assert ledger.version_from_system_fingerprint("fp_abc") is None
    # The simulator's fingerprint names the simulator, never a vLLM version.
    assert ledger.version_from_system_fingerprint("itlaudit-sim-0.1.0-bd448dc9") == "itlaudit-sim 0.1.0"


def test_check_new_run_names_a_repeat_and_refuses_it_only_with_no_repeat(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    fingerprint = ledger.variant_fingerprint(_launched(tmp_path, []), "K0", SERVER)
    assert ledger.check_new_run(fingerprint, path) is None  # empty ledger
    ledger.append(path, [ledger.run_line("run-1", tmp_path / "run-1", fingerprint, {"requests": 2})])
    earlier = ledger.check_new_run(fingerprint, path)
    assert earlier is not None and earlier["run_id"] == "run-1"
    warning = ledger.repeat_warning(earlier, "K0", tmp_path / "run-2")
    assert f"`itlaudit diff {tmp_path / 'run-1'} {tmp_path / 'run-2'}`" in warning
    with pytest.raises(DuplicateRunError, match=r"run .run-1.*--no-repeat"):
        ledger.check_new_run(fingerprint, path, no_repeat=True)
    other = ledger.variant_fingerprint(_launched(tmp_path, ["-x"]), "K0", SERVER)
    assert ledger.check_new_run(other, path, no_repeat=True) is None


def test_fingerprint_holds_the_url_and_for_launched_servers_the_gpu(tmp_path: Path) -> None:
    plain = parse_scenario(SCENARIO.format(url="http://x"), tmp_path / "s.toml")
    one = ledger.variant_fingerprint(plain, "K0", SERVER, url="http://gb10:8000")
    two = ledger.variant_fingerprint(plain, "K0", SERVER, url="http://sm120:8000")
    assert one.digest != two.digest and one.build["url"] == "http://gb10:8000"
    unknown = {"version": None, "system_fingerprint": None}
    assert (
        ledger.variant_fingerprint(plain, "K0", unknown, url="http://a").digest
        != ledger.variant_fingerprint(plain, "K0", unknown, url="http://b").digest
    )
    gb10 = [{"name": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580"}]
    h200 = [{"name": "NVIDIA H200", "compute_capability": "9.0", "driver": "580"}]
    launched = _launched(tmp_path, [])
    on_gb10 = ledger.variant_fingerprint(launched, "K0", SERVER, url="http://127.0.0.1:4001", gpus=gb10)
    assert on_gb10.build["gpus"] == ["NVIDIA GB10 (sm 12.1)"]
    assert on_gb10.build["url"] is None  # a launched server's port is new every time
    same = ledger.variant_fingerprint(launched, "K0", SERVER, url="http://127.0.0.1:4999", gpus=gb10)
    assert same.digest == on_gb10.digest
    assert ledger.variant_fingerprint(launched, "K0", SERVER, gpus=h200).digest != on_gb10.digest
    assert ledger.variant_fingerprint(launched, "K0", SERVER, gpus=None).build["gpus"] is None


def test_matrix_attaches_the_latest_conclusion(tmp_path: Path) -> None:
    fingerprint = ledger.variant_fingerprint(_launched(tmp_path, []), "K0", SERVER)
    lines = [
        ledger.run_line("run-1", tmp_path, fingerprint, {"requests": 2, "outputs_sha256": "ab" * 32}),
        ledger.conclusion_line("run-1", "K0", "first guess"),
        ledger.conclusion_line("run-1", "K0", "FULL graph is not the cause"),
    ]
    (row,) = ledger.matrix(lines)
    assert row["conclusion"] == "FULL graph is not the cause"
    assert row["hash"] == "ab" * 8
    assert row["build"] == "vLLM 0.32.0 (vllm-0.32.0-67068cd2)"
    unnamed = ledger.variant_fingerprint(
        _launched(tmp_path, []), "K0", {"version": None, "system_fingerprint": None}
    )
    (bare,) = ledger.matrix([ledger.run_line("run-2", tmp_path, unnamed, {"requests": 2})])
    assert bare["build"] == "unknown (no /version)"  # never "(None)"


def test_ledger_command_names_a_repeat_and_refuses_it_with_no_repeat(tmp_path: Path) -> None:
    book = str(tmp_path / "ledger.jsonl")
    with sim_server(SimConfig(ttft_ms=1, step_ms=0)) as url:
        scenario = parse_scenario(_scenario(tmp_path, url).read_text(), _scenario(tmp_path, url))
        first = run_scenario(scenario, run_dir=tmp_path / "run-1").run_dir
        second = run_scenario(scenario, run_dir=tmp_path / "run-2").run_dir

    added = itlaudit("ledger", "--ledger", book, "add", str(first))
    assert added.returncode == 0, added.stderr
    refused = itlaudit("ledger", "--ledger", book, "add", "--no-repeat", str(second))
    assert refused.returncode == 2
    assert "run 'run-1'" in refused.stderr and "--no-repeat" in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert len(Path(book).read_text().splitlines()) == 1  # nothing written on refusal
    repeated = itlaudit("ledger", "--ledger", book, "add", str(second))
    assert repeated.returncode == 0, repeated.stderr
    assert "same experiment as run 'run-1'" in repeated.stdout

    lines = [json.loads(line) for line in Path(book).read_text().splitlines()]
    assert [line["run_id"] for line in lines] == ["run-1", "run-2"]
    assert lines[0]["fingerprint"] == lines[1]["fingerprint"]
    assert lines[0]["result"]["outputs_sha256"] == lines[1]["result"]["outputs_sha256"]  # greedy: same text

    concluded = itlaudit("ledger", "--ledger", book, "conclude", "run-1", "K0", "baseline is clean")
    assert concluded.returncode == 0, concluded.stderr
    rows = ledger.matrix(ledger.load_ledger(Path(book)))
    assert [r["conclusion"] for r in rows] == ["baseline is clean", ""]
    assert rows[1]["result"].endswith("(repeat of run-1)")
    shown = itlaudit("ledger", "--ledger", book)
    assert shown.returncode == 0 and "run-1" in shown.stdout and "conclusion" in shown.stdout


def test_ledger_command_bad_run_folder_is_one_line(tmp_path: Path) -> None:
    result = itlaudit("ledger", "--ledger", str(tmp_path / "l.jsonl"), "add", str(tmp_path / "nope"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
