"""A real vLLM CPU server with a reasoning parser (`--reasoning-parser qwen3`, vLLM 0.32): on chat it
streams the thinking in `delta.reasoning` and counts it in usage.completion_tokens_details. The tiny
model never writes `</think>`, so every reply is capped while still thinking: issue 35 item 1's
"a cap inside the thinking is a truncation". The records keep the reasoning channel apart from the
answer, the tokens stay counted by the server's usage (TTFT is the first token of either channel, as
vLLM counts it), and `reasoning_truncated` makes the variant not comparable. The quiet case, a capped
chat reply with an answer and no reasoning channel, is tests/test_vllm_integration.py's
test_chat_without_max_tokens_exposes_generation_config_cap.

CI cost: ~40 s (the server's start, ~30 s on 2 cores; 2 chat requests of 16 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import tiny_run, vllm_server

pytestmark = pytest.mark.vllm

thinking_url = vllm_server("--reasoning-parser", "qwen3")


def test_a_reply_capped_while_thinking_is_a_truncation(thinking_url: str, tmp_path: Path) -> None:
    done = tiny_run(
        "run", thinking_url, tmp_path / "run", "--endpoint", "chat", "--ignore-eos", output_len=16
    )
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "run"
    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    derived = [json.loads(line) for line in (folder / "derived.jsonl").read_text().splitlines()]
    for record, line in zip(records, derived, strict=True):
        assert record["text"] == "" and record["reasoning"], record  # every token was the thinking's
        assert record["finish_reason"] == "length" and record["completion_tokens"] == 16
        # vLLM 0.32 counts a few of the streamed reasoning tokens apart (14-15 of 16 measured)
        assert 0 < record["reasoning_tokens"] <= 16
        assert sum(record["chunk_reasoning_len"]) == len(record["reasoning"])
        assert line["token_source"] == "usage" and line["decode_tokens_per_chunk"] == 1.0
        assert line["ttft_ms"] > 0 and line["ttfa_ms"] is None  # a first token, and no answer
        assert line["reasoning_tokens"] == record["reasoning_tokens"]
        (cut,) = [f for f in line["finding_details"] if f["code"] == "reasoning_truncated"]
        assert cut["evidence"]["reasoning_tokens"] == record["reasoning_tokens"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["variants"]["server"]["findings"]["reasoning_truncated"] == 2
    assert "reasoning_truncated" in done.stdout and "not comparable" in done.stdout
    # TTFT as vLLM counts it (either channel), and the answer's section beside it: none came
    bench = summary["variants"]["server"]["benchmark"]
    assert bench["ttft_ms"]["count"] == 2 and bench["ttfa_ms"]["count"] == 0
    rows = {line[:40].strip(): line[41:].strip() for line in done.stdout.splitlines() if len(line) > 41}
    assert rows["Replies that reached an answer:"] == "0" and rows["Mean TTFA (ms):"] == "n/a"
