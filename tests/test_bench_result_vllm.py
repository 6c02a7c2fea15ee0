"""--save-result against a file the real `vllm bench serve` writes in the same round, on the vLLM CPU
testbed: every key it writes (but its per-request arrays) is in itlaudit's file, with its type."""

from __future__ import annotations

import json
from pathlib import Path

import bench_parity
import pytest
from vllm_server import testbed_python as vllm_python  # not test_-named: pytest would collect it
from vllm_server import tiny_model, vllm_server

from itlaudit.store.result import PER_REQUEST_ARRAYS, save_result

pytestmark = pytest.mark.vllm
server_url = vllm_server()


def test_save_result_covers_a_real_vllm_bench_result(server_url: str, tmp_path: Path) -> None:
    workload = bench_parity.Workload(input_len=32, output_len=16, rate=8, requests=8)
    bench_parity.run_round(
        server_url,
        workload,
        tmp_path,
        tokenizer=tiny_model(),
        served_model_name="tiny",
        vllm_python=vllm_python(),
    )
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    (written,) = save_result(tmp_path / "ours.json", tmp_path / "run")
    ours = json.loads(written.read_text())
    assert set(theirs) - PER_REQUEST_ARRAYS - set(ours) == set()
    for key, value in theirs.items():
        if key not in PER_REQUEST_ARRAYS and value is not None and ours[key] is not None:
            expected = (int, float) if isinstance(value, float) else type(value)
            assert isinstance(ours[key], expected), (key, ours[key], value)
    assert ours["completed"] == theirs["completed"] == workload.requests
    # itlaudit counts input tokens from the server's usage.prompt_tokens: exactly what was sent. vllm bench
    # counts its own tokenisation of each decoded random prompt, which may differ by a token or two (seen:
    # 258 against the 256 the server counted), so it is held to 2%.
    assert ours["total_input_tokens"] == workload.requests * workload.input_len
    assert abs(theirs["total_input_tokens"] - ours["total_input_tokens"]) <= 0.02 * ours["total_input_tokens"]
    assert ours["simulated"] is False and ours["server_build"].startswith("vLLM ")
