"""Server metrics against the vLLM CPU testbed: ngram K3 launched by itlaudit reports each request's
acceptance (partial: ngram drafts from the prompt), which must agree with the stream; its /metrics is
sampled through the run; and --profile's hooks produce a trace from a server with a profiler config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from simkit import itlaudit
from vllm_server import server_spec

from itlaudit.analysis.request_acceptance import server_acceptance
from itlaudit.model.codes import SPEC_DECODE_METRICS_DISAGREE
from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.launcher import PER_REQUEST_SPEC_FLAG, launch, python_argv
from itlaudit.store.jsonl import load_records
from itlaudit.store.server_metrics import read_server_metrics
from itlaudit.telemetry.window import Telemetry

pytestmark = pytest.mark.vllm

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Without stacks: stopping the profiler tables key averages, minutes with stacks on two cores.
PROFILER = {"profiler": "torch", "torch_profiler_with_stack": False}


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LaunchSpec, Path]]:
    traces = tmp_path_factory.mktemp("traces")
    profiler = {**PROFILER, "torch_profiler_dir": str(traces)}
    spec = server_spec(["--speculative-config", json.dumps(NGRAM), "--profiler-config", json.dumps(profiler)])
    with launch(spec, tmp_path_factory.mktemp("vllm") / "server.log") as server:
        yield server.url, spec, traces


def test_launched_ngram_server_reports_acceptance_per_request_and_it_agrees(
    ngram_server: tuple[str, LaunchSpec, Path], tmp_path: Path
) -> None:
    url, spec, _ = ngram_server
    assert python_argv(spec, 1)[-2:] == [PER_REQUEST_SPEC_FLAG, "summary"]  # added: vLLM 0.32 has it
    scenario = tmp_path / "s.toml"
    workload = (
        'prompts = ["one two three four one two three four one two three four one two"]\n'
        "num_requests = 4\nconcurrency = 2\nmax_tokens = 40\ntemperature = 0"
    )
    scenario.write_text(
        f'name = "ng"\nendpoint = "completions"\nmodel = "tiny"\n\n[workload]\n{workload}\n\n'
        f'[[variants]]\nname = "ngram-K3"\nurl = "{url}"\n',
        encoding="utf-8",
    )
    out = tmp_path / "run"
    result = itlaudit("run", str(scenario), "--out", str(out), "--metrics-period", "0.2")
    assert result.returncode == 0, result.stderr
    records = load_records(out / "requests.jsonl")
    counts = [server_acceptance(r) for r in records]
    assert len(records) == 4 and all(c is not None and c["k"] == 3 and c["steps"] > 0 for c in counts)
    accepted = sum(c["accepted"] for c in counts if c)
    drafted = sum(c["drafted"] for c in counts if c)
    assert 0 < accepted < drafted  # partial acceptance: the cross-check has something to check
    derived = [json.loads(line) for line in (out / "derived.jsonl").read_text().splitlines()]
    codes = {f["code"] for d in derived for f in d["finding_details"]}
    assert SPEC_DECODE_METRICS_DISAGREE not in codes
    rows = read_server_metrics(out)["ngram-K3"]
    assert len(rows) >= 2 and any(
        r.get("counters", {}).get("vllm:spec_decode_num_drafts_total") for r in rows
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["server"]["ngram-K3"]["server_acceptance_length"] == pytest.approx(
        1 + accepted / sum(c["steps"] for c in counts if c)
    )


def test_profile_hooks_write_a_trace(ngram_server: tuple[str, LaunchSpec, Path], tmp_path: Path) -> None:
    url, spec, traces = ngram_server
    window = Telemetry(metrics_period_s=None, profile=True).window("ng", url, tmp_path, launched=spec)
    window.start()
    recorded = window.stop()
    assert recorded["profile"] == {"profiled": True, "trace": str(traces), "problem": None}
    assert any(traces.iterdir())
