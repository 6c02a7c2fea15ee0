"""itlaudit against the real vLLM CPU engine: the behaviour the tool exists to audit, for real.

One capped server for the module (truncation, stop ids, `run --url`), plus one full `itlaudit
compare` of the shipped CPU scenario, which launches its own K0 and K3 servers in turn.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import SERVED_MODEL, vllm_server

from itlaudit.capture.client import stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.model.records import RequestParams
from itlaudit.workflows.server import RUN_DIR_ENV

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
PROMPT = "The quick brown fox"
capped_url = vllm_server("--override-generation-config", '{"max_new_tokens": 128}')


def itlaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", *args], cwd=cwd, capture_output=True, text=True, timeout=900
    )


def write_scenario(path: Path, url: str, workload: str, endpoint: str = "completions") -> Path:
    path.write_text(
        f'name = "{path.stem}"\nendpoint = "{endpoint}"\nmodel = "{SERVED_MODEL}"\n\n'
        f'[workload]\n{workload}\n\n[[variants]]\nname = "K0"\nurl = "{url}"\n',
        encoding="utf-8",
    )
    return path


def lines(run_dir: Path, name: str = "requests.jsonl") -> list[dict]:
    """requests.jsonl holds raw records; derived.jsonl their figures and findings."""
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_server_side_128_cap_is_flagged(capped_url: str, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path / "capped.toml",
        capped_url,
        f'prompts = ["{PROMPT}"]\nnum_requests = 3\nmax_tokens = 512\nignore_eos = true\ntemperature = 0',
    )
    result = itlaudit(
        "run", str(scenario), "--out", str(tmp_path / "run"), "--fail-on-findings", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    got = lines(tmp_path / "run")
    assert [line["completion_tokens"] for line in got] == [128, 128, 128]
    assert all(
        "truncated_below_max_tokens" in d["findings"] for d in lines(tmp_path / "run", "derived.jsonl")
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (common,) = [f for f in summary["run_findings"] if f["code"] == "common_cap"]
    assert "128" in common["message"]


def test_chat_without_max_tokens_exposes_generation_config_cap(capped_url: str, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path / "nomax.toml",
        capped_url,
        'prompts = ["Hello there"]\nnum_requests = 1\ntemperature = 0',
        "chat",
    )
    result = itlaudit("run", str(scenario), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = lines(tmp_path / "run")
    assert line["finish_reason"] == "length" and line["completion_tokens"] == 128
    (derived,) = lines(tmp_path / "run", "derived.jsonl")
    (detail,) = [d for d in derived["finding_details"] if d["code"] == "truncated_below_max_tokens"]
    assert detail["evidence"]["max_tokens"] is None
    # capped, but with an answer and no reasoning channel: not reasoning_truncated (its firing case is
    # tests/test_reasoning_vllm.py)
    assert line["reasoning"] == "" and line["text"] and "reasoning_truncated" not in derived["findings"]


def test_real_stop_token_id_ends_cleanly(capped_url: str) -> None:
    async def go() -> tuple:
        free = await stream_request(
            plan_request(
                base_url=capped_url,
                endpoint="completions",
                model=SERVED_MODEL,
                prompt=PROMPT,
                params=RequestParams(max_tokens=32, ignore_eos=True, temperature=0.0),
                request_id="free",
                variant="K0",
            )
        )
        ids = [i for chunk in free.chunks.token_ids if chunk for i in chunk]
        stop_id = ids[4]
        stopped = await stream_request(
            plan_request(
                base_url=capped_url,
                endpoint="completions",
                model=SERVED_MODEL,
                prompt=PROMPT,
                params=RequestParams(max_tokens=32, temperature=0.0, stop_token_ids=[stop_id]),
                request_id="stop",
                variant="K0",
            )
        )
        return ids, stop_id, stopped

    ids, stop_id, stopped = asyncio.run(go())
    from itlaudit.analysis.findings import request_findings
    from itlaudit.analysis.metrics import request_metrics

    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason == stop_id
    assert stopped.completion_tokens == ids.index(stop_id) + 1  # vLLM counts the stop token
    # About the stop: nothing. A starved 2-core engine may flush this 5-token reply in one burst, which
    # chunks_coalesced (a timing warning, seen once in CI) says truthfully; it is not about the stop token.
    found = request_findings(stopped, request_metrics(stopped))
    assert [f.code for f in found if f.code not in {"chunks_coalesced", "client_saturated"}] == []


def test_compare_cpu_k0_vs_k3_shows_inflation_and_full_acceptance(tmp_path: Path) -> None:
    result = itlaudit(
        "compare", str(REPO / "scenarios" / "cpu-k0-vs-k3.toml"), "--out", str(tmp_path / "cmp"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    comparison = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    k0, k3 = summary["variants"]["K0"], summary["variants"]["K3"]
    # Warnings the 2-core testbed really produces: the random-weight model writes digit soup
    # (gibberish_suspected), and a starved API server flushes K0 chunks in bursts (chunks_coalesced).
    # Nothing else may fire: no truncation, no stop or usage problem, no stream error.
    # On 2 cores the engine also starves itlaudit's own capture loop at times; the self-audit saying so
    # (client_saturated) is the tool being honest, not a fault of the server.
    tolerated = {"gibberish_suspected", "chunks_coalesced", "client_saturated"}
    assert set(k0["findings"]) <= tolerated and set(k3["findings"]) <= tolerated, (
        k0["findings"],
        k3["findings"],
    )
    # K0 sends one token a chunk; a CPU-starved engine may coalesce a rare pair (seen once in 1024 on a
    # 2-core CI box), which the chunks_coalesced finding names. Every token is still counted.
    k0_hist = {int(k): v for k, v in k0["tokens_per_chunk_hist"].items()}
    assert sum(k * v for k, v in k0_hist.items()) == 4 * 256 and k0_hist[1] >= 0.99 * sum(k0_hist.values())
    # 256 tokens: 1 prefill token, then chunks of 4 (the model is its own draft, so at temperature 0 every
    # draft is accepted) and one of 3 at the end. Nearly: the draft's single-token steps and the target's
    # 4-token verification round differently in bf16, and on some CPUs (seen on an AMX host: one 2-token
    # chunk per request, in the batch of 4) a near tie flips one draft. Every token is still counted, and
    # the stream's acceptance must agree with the server's own /metrics counters either way.
    k3_hist = {int(k): v for k, v in k3["tokens_per_chunk_hist"].items()}
    assert sum(k * v for k, v in k3_hist.items()) == 4 * 256
    assert k3_hist[1] == 4 and k3_hist[4] >= 0.95 * (sum(k3_hist.values()) - 4)
    assert 3.7 < k3["itl_inflation"]["p50"] < 4.1
    spec = comparison["variants"]["K3"]["spec_decode"]
    assert spec["acceptance_rate"] >= 0.98
    assert 3.9 <= spec["acceptance_length"] <= 4.0
    assert all(rate >= 0.95 for rate in spec["per_position_acceptance"])  # seen: 1.0, 0.984, 0.977
    assert comparison["variants"]["K0"]["spec_decode"] is None
    assert comparison["findings"] == []
    stream = comparison["variants"]["K3"]["stream_acceptance_length"]
    assert abs(stream - spec["acceptance_length"]) < 0.05 and stream > 3.9
    assert not _vllm_processes_left(tmp_path / "cmp"), "compare left a vLLM server running"


def _vllm_processes_left(run_dir: Path) -> list[int]:
    """Processes still tagged with this run's folder (workflows.run sets ITLAUDIT_RUN_DIR on launch)."""
    tag = f"{RUN_DIR_ENV}={run_dir.resolve()}".encode()
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag in (entry / "environ").read_bytes().split(b"\0"):
                left.append(int(entry.name))
        except OSError:
            continue
    return left
