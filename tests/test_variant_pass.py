"""One variant's pass and one run folder for every command: `run`, `compare`, `sweep`, `smoke` and a
bisect trial each measure a variant through VariantPass (seen by wrapping its `run`, the one seam,
with a recorder that still runs it), write meta.json with the same keys (environment included), and
a bisection's trials capture with the options it was given (--stamp, --workers), read back from the
trial's records and meta.json."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from simkit import sim_server

from itlaudit import cli
from itlaudit.model.meta import META_KEYS
from itlaudit.model.records import RequestRecord
from itlaudit.model.scenario import load_scenario
from itlaudit.model.vocabulary import LoadAxis
from itlaudit.serve.sim import SimConfig
from itlaudit.smoke.runner import run_smoke
from itlaudit.smoke.suite import load_suite
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.workflows.compare import run_compare
from itlaudit.workflows.run import run_scenario
from itlaudit.workflows.sweep import SweepConfig, run_sweep
from itlaudit.workflows.variant_pass import VariantPass

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM

ROOT = Path(__file__).resolve().parent.parent
SIM = SimConfig(step_ms=1, ttft_ms=2)
SCENARIO = """name = "pass"
endpoint = "completions"
model = "auto"

[workload]
prompts = ["Explain how speculative decoding changes inter-token latency.", "Write a haiku about a river."]
num_requests = 4
concurrency = 2
max_tokens = 8
ignore_eos = true
temperature = 0

[[variants]]
name = "A"
[[variants]]
name = "B"
"""


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """PNGs cost seconds per run folder; nothing here reads them."""
    monkeypatch.setattr("itlaudit.report.plots.write_plots", lambda *args, **kwargs: [])


@pytest.fixture()
def passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    """Every pass made, as (variant, run folder), in order."""
    calls: list[tuple[str, Path]] = []
    original = VariantPass.run

    async def recorded(self: VariantPass) -> Any:
        calls.append((self.variant.name, self.folder.path))
        return await original(self)

    monkeypatch.setattr(VariantPass, "run", recorded)
    return calls


@pytest.fixture()
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "pass.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _meta(folder: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
    return meta


def test_run_makes_one_pass_per_variant_into_its_folder(
    tmp_path: Path, scenario_file: Path, passes: list[tuple[str, Path]]
) -> None:
    with sim_server(SIM) as url:
        outcome = run_scenario(load_scenario(scenario_file), url=url, run_dir=tmp_path / "run")
    assert passes == [("A", tmp_path / "run"), ("B", tmp_path / "run")]
    assert {name: block.requests for name, block in outcome.derivation.summary.variants.items()} == {
        "A": 4,
        "B": 4,
    }
    meta = _meta(tmp_path / "run")
    assert set(META_KEYS) <= set(meta)
    assert meta["environment"] and meta["variants"]["A"]["environment"]["simulated"] is True
    # finish() says what the folder's derivation and report took (benchmarks/startup.py reads it)
    assert set(meta["finish_s"]) == {"derive", "report"} and all(t >= 0 for t in meta["finish_s"].values())


def test_compare_makes_its_passes_with_the_counter_window(
    tmp_path: Path, scenario_file: Path, passes: list[tuple[str, Path]]
) -> None:
    with sim_server(SIM) as url:
        outcome, comparison = run_compare(load_scenario(scenario_file), url=url, run_dir=tmp_path / "cmp")
    assert [name for name, _ in passes] == ["A", "B"]
    info = _meta(tmp_path / "cmp")["variants"]["A"]
    assert "before" in info and "after" in info  # the window hook ran around the measured requests
    assert set(comparison.variants) == {"A", "B"}
    assert (tmp_path / "cmp" / "report.md").exists()  # drawn once, after compare.json
    assert len(outcome.records) == 8


def test_sweep_makes_one_pass_per_trial(
    tmp_path: Path, scenario_file: Path, passes: list[tuple[str, Path]]
) -> None:
    config = SweepConfig(str(scenario_file), LoadAxis.CONCURRENCY, [1.0, 2.0], ["A"])
    with sim_server(SIM) as url:
        sweep_dir, _ = run_sweep(
            load_scenario(scenario_file), config, out=tmp_path / "sweep", variant_urls={"A": url}
        )
    assert [name for name, _ in passes] == ["A", "A"]
    folders = [folder for _, folder in passes]
    assert all(folder.parent.parent == sweep_dir for folder in folders)
    for folder in folders:
        meta = _meta(folder)
        assert set(META_KEYS) <= set(meta) and "sweep" in meta


def test_smoke_makes_its_passes_through_compare(tmp_path: Path, passes: list[tuple[str, Path]]) -> None:
    suite = load_suite(ROOT / "scenarios" / "smoke" / "sim")
    one = dataclasses.replace(suite, scenarios=[suite.scenario("chat-batch")], checks=[])
    with sim_server(SIM) as url:
        run_smoke(one, urls={"*": url}, out_dir=tmp_path / "smoke")
    assert [name for name, _ in passes] == ["K0", "K3"]
    assert {folder.name for _, folder in passes} == {"chat-batch-K0", "chat-batch-K3"}


def test_bisect_trials_capture_with_the_given_stamp_and_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passes: list[tuple[str, Path]]
) -> None:
    """Both ends of a two-commit range probed (the simulator as "vLLM at commit X"), every trial
    through the pass, captured as asked: loop stamps from two capture processes."""
    shas = [os.urandom(20).hex() for _ in range(2)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{sha}\n" for sha in shas))
    scenario = tmp_path / "probe.toml"
    workload = SCENARIO.split("[[variants]]")[0].replace(
        "max_tokens = 8", "max_tokens = 160\nmin_tokens = 160"
    )
    scenario.write_text(workload + '[[variants]]\nname = "build"\nurl = "http://127.0.0.1:9"\n')
    server = (
        f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from 1 --mode cap {{commit}} {{port}}"
    )
    args = ["--from", shas[0], "--to", shas[1], "--commits-file", str(commits), "--provider", "command"]
    args += ["--server-cmd", server, "--ready-timeout", "30", "--scenario", str(scenario)]
    args += ["--regress", "finding:truncated_below_max_tokens", "--out", str(tmp_path / "bisect")]
    monkeypatch.setattr(sys, "argv", ["itlaudit", "bisect", *args, "--stamp", "loop", "--workers", "2"])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    stored = json.loads((tmp_path / "bisect" / "bisect.json").read_text())["settings"]
    assert stored["capture"] == {"workers": 2, "stamp": "loop"}  # typed; the access is never stored
    assert passes and all(name == "build" for name, _ in passes)
    for _, trial in passes:
        records = [RequestRecord.from_json(line) for line in iter_jsonl(trial / "requests.jsonl")]
        assert records and {r.stamp for r in records} == {"loop"}
        assert {r.worker for r in records} == {0, 1}
        meta = _meta(trial)
        assert set(META_KEYS) <= set(meta) and "bisect" in meta
        assert len(meta["variants"]["build"]["workers"]) == 2
