"""A real vLLM CPU server that bundles engine steps into one SSE chunk (`--stream-interval 4`, vLLM
0.32): without speculative decoding its chunks carry 4 tokens, which a reader of tokens per decode
chunk would take for an acceptance length. `compare` names it (stream_bundled, with the steps per
chunk); the quiet case, a default K0 and K3 on the same engine, is tests/test_vllm_integration.py's
compare (its compare.json findings are empty).

CI cost: ~40 s (the server's start, ~30 s on 2 cores; 2 requests of 64 tokens, ~5 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import vllm_server

pytestmark = pytest.mark.vllm

bundled_url = vllm_server("--stream-interval", "4")


def test_a_k0_server_streaming_four_steps_a_chunk_is_named(bundled_url: str, tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "itlaudit", "compare", "--url", bundled_url, "--model", "tiny",
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "64",
        "--num-prompts", "2", "--max-concurrency", "1", "--out", str(tmp_path / "run"), "--no-plots",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    comparison = json.loads((tmp_path / "run" / "compare.json").read_text())
    (bundled,) = [f for f in comparison["findings"] if f["code"] == "stream_bundled"]
    evidence = bundled["evidence"]
    assert evidence["step_tokens"] == 1  # vLLM counted generated tokens and drafted none: K=0
    assert (
        3.5 <= evidence["steps_per_chunk"] <= 4.0
        and evidence["chunks_over"] >= 0.9 * evidence["decode_chunks"]
    )
    assert "acceptance_length_mismatch" not in {f["code"] for f in comparison["findings"]}
    # Every output says it: the summary counts it, the terminal block lists it.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["variants"]["server"]["findings"]["stream_bundled"] == 1
    assert "stream_bundled" in done.stdout and "per chunk of ~" in done.stdout
