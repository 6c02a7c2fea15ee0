"""--save-result against a file the real `vllm bench serve` writes in the same round, on the vLLM CPU
testbed: every key it writes (but its per-request arrays) is in itlaudit's file, with its type; and the
end-of-run block carries every line vllm bench's own source prints."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import bench_parity
import pytest
from simkit import itlaudit, sim_server
from vllm_server import testbed_python as vllm_python  # not test_-named: pytest would collect it
from vllm_server import tiny_model, vllm_server

from itlaudit.serve.sim import SimConfig
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


def _vllm_block_labels() -> set[str]:
    """Every fixed label and section title vllm bench 0.32's result block prints, read from the
    testbed's own vllm/benchmarks/serve.py: "{:<40}…".format("Label:", …) and "{s:{c}^{n}}".format(s=…)."""
    (source,) = vllm_python().parent.parent.glob("lib/python3*/site-packages/vllm/benchmarks/serve.py")
    labels = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        template = node.func.value
        if node.func.attr != "format" or not isinstance(template, ast.Constant):
            continue
        if str(template.value).startswith("{:<40}") and node.args and isinstance(node.args[0], ast.Constant):
            labels.add(str(node.args[0].value))
        labels |= {
            str(k.value.value) for k in node.keywords if k.arg == "s" and isinstance(k.value, ast.Constant)
        }
    return labels


# vllm bench's lines that belong to runs itlaudit does not make (and why), so the block has no place
# for them: embeddings, audio, its probe requests, diffusion decoding, --goodput's goodput line.
ELSEWHERE = {
    "Input throughput (inputs/s):": "embedding models",
    "RTFx (Inverse Real-Time Factor):": "audio transcription",
    "Request goodput (req/s):": "vllm bench's --goodput (itlaudit: sweep's goodput)",
    "Probe Requests": "vllm bench's probe requests",
    "Probe requests completed:": "vllm bench's probe requests",
    "Probe requests failed:": "vllm bench's probe requests",
    "Median probe E2EL (ms):": "vllm bench's probe requests",
    "P99 probe E2EL (ms):": "vllm bench's probe requests",
    "Max probe E2EL (ms):": "vllm bench's probe requests",
    "Diffusion Decoding": "diffusion models",
}


def test_the_result_block_carries_every_line_vllm_bench_prints(tmp_path: Path) -> None:
    """A compare of K0 against a speculating simulator at a configured rate prints every label and
    section vllm bench 0.32's block prints (read from its source in the testbed, not a copy), but the
    ones listed in ELSEWHERE; the Speculative Decoding section gives the server's figures with the
    stream's beside them. One compare of 3 requests: ~2 s."""
    theirs = _vllm_block_labels()
    assert {"Peak concurrent requests:", "Speculative Decoding", "Accepted tokens:"} <= theirs  # read right
    k3 = SimConfig(step_ms=1.0, ttft_ms=2.0, num_speculative_tokens=3, acceptance_prob=0.7)
    with sim_server(SimConfig(step_ms=1.0, ttft_ms=2.0)) as k0_url, sim_server(k3) as k3_url:
        done = itlaudit(
            "compare", "--variant", f"K0={k0_url}", "--variant", f"K3={k3_url}", "--num-prompts", "3",
            "--random-output-len", "32", "--request-rate", "20", "--out", str(tmp_path / "run"), "--no-plots",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    k3_block = done.stdout[done.stdout.index("Serving Benchmark Result: K3") :]
    # The title names the variant: " Serving Benchmark Result: K3 ".
    missing = {label for label in theirs - set(ELSEWHERE) if label.strip() not in k3_block}
    assert not missing, missing
    rows = {line[:40].strip(): line[41:].split() for line in k3_block.splitlines() if len(line) > 41}
    assert rows[""][-2:] == ["/metrics", "stream"] and len(rows["Acceptance length:"]) == 2
    assert int(rows["Drafts:"][0]) > 0 and len(rows["Accepted tokens:"]) == 2
