"""Issue 22's done-when against the real vLLM CPU testbed: `itlaudit run --url` with vllm bench
serve's flags alone, no scenario file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import SERVED_MODEL, itl_said, vllm_server

from itlaudit.analysis.validity import variant_validity
from itlaudit.store.folder import RunFiles

pytestmark = pytest.mark.vllm
server_url = vllm_server()

PROMPTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN = 32, 8, 128, 128


def test_flags_only_run_against_vllm(server_url: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "itlaudit", "run", "--url", server_url, "--dataset-name", "random"),
            *("--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)),
            *("--num-prompts", str(PROMPTS), "--max-concurrency", str(CONCURRENCY)),
            *("--out", str(tmp_path / "run"), "--save-result", "result.json"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert len(records) == PROMPTS
    assert {r["status"] for r in records} == {"ok"}
    assert {r["model"] for r in records} == {SERVED_MODEL}  # no --model: the server's first model
    assert {(r["prompt_tokens"], r["completion_tokens"]) for r in records} == {(INPUT_LEN, OUTPUT_LEN)}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    block = summary["variants"]["server"]
    assert block["requests"] == PROMPTS
    # Full length, no error, no gibberish; a busy 2-core box may add load warnings (chunks_coalesced,
    # client_saturated), which leave the variant comparable.
    assert variant_validity(RunFiles(tmp_path / "run").summary, "server").comparable, block["findings"]
    itl_said(block, records)  # measured, or None where a starved server flushed every reply whole
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert "--num-prompts 32" in meta["command_line"]
    # vllm bench serve's key names, with its meanings (completed requests, generated tokens)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert (saved["completed"], saved["total_input_tokens"], saved["total_output_tokens"]) == (
        PROMPTS,
        PROMPTS * INPUT_LEN,
        PROMPTS * OUTPUT_LEN,
    )
    spread = ("median_tpot_ms", "p99_itl_ms") if block["itl_ms"]["p50"] is not None else ()  # see itl_said
    for key in ("request_throughput", "output_throughput", "mean_ttft_ms", *spread):
        assert saved[key] > 0, key
    print(result.stdout)
