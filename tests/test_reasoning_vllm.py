"""A real vLLM CPU server with a reasoning parser (`--reasoning-parser qwen3`, vLLM 0.32) serving the tiny
Llama made to think (itlaudit/serve/tinymodel.py --arch think): whatever the prompt, each chat reply is
one walk, `<think>`, the 17 tokens of tinymodel.THINKING, `</think>`, then tinymodel.ANSWER's 6 tokens
round and round up to max_tokens. A random model never closes its thinking, so only a model built to
think makes the server stream both channels: the thinking in `delta.reasoning`, the answer in
`delta.content`, the thinking counted in usage.completion_tokens_details.reasoning_tokens.

What the walk fixes, as the server streams it (measured): the `<think>` token comes in a chunk of its
own with no text, and is the first token (TTFT, as vLLM counts it); `</think>` likewise, so the first
answer token (TTFA) is 19 tokens after the first; reasoning_tokens counts the thinking tokens only (17,
the markup in neither channel), so completion - reasoning is the answer plus the two markup tokens.

Two runs against one server (issue 35 item 1's test): max_tokens past `</think>`, an answered reply
(TTFT and TTFA both reported, no truncation); max_tokens inside the thinking, a reply capped while
thinking (`reasoning_truncated`, the variant not comparable, no TTFA).

CI cost: 38-55 s measured on the 2-core box (one server: its start, 30-41 s, the most; two `itlaudit
run`s of 2 chat requests, 3-6 s each; teardown ~2 s; plus ~6 s to build the thinking model where
`itlaudit testbed build-model` has not)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from vllm_server import TIMING_FINDINGS, thinking_model, tiny_run, vllm_server

from itlaudit.serve.tinymodel import ANSWER, THINKING

pytestmark = pytest.mark.vllm

THINKING_TOKENS = 17  # THINKING's tokens in the model's vocabulary (its builder checks the walk)
FIRST_ANSWER_AT = THINKING_TOKENS + 2  # tokens after the first (`<think>`): the thinking, `</think>`

thinking_url = vllm_server("--reasoning-parser", "qwen3", model_of=thinking_model)


def _run(url: str, out: Path, max_tokens: int) -> subprocess.CompletedProcess[str]:
    """`itlaudit run` on chat: 2 random prompts, each reply capped at max_tokens (ignore_eos, as vllm
    bench's random dataset sets it, changes nothing: the walk has no EOS)."""
    done = tiny_run("run", url, out, "--endpoint", "chat", output_len=max_tokens)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rows(stdout: str) -> dict[str, str]:
    """The result block's rows, label to value (the label column is 40 characters wide)."""
    return {line[:40].strip(): line[41:].strip() for line in stdout.splitlines() if len(line) > 41}


def test_an_answer_after_the_thinking_has_ttft_ttfa_and_both_channels(
    thinking_url: str, tmp_path: Path
) -> None:
    max_tokens = 32
    answer_tokens = max_tokens - FIRST_ANSWER_AT  # 13: the answer twice and its first token again
    folder = tmp_path / "run"
    done = _run(thinking_url, folder, max_tokens)
    records = _lines(folder / "requests.jsonl")
    derived = _lines(folder / "derived.jsonl")
    for record, line in zip(records, derived, strict=True):
        assert record["reasoning"] == THINKING and record["reasoning_tokens"] == THINKING_TOKENS, record
        assert record["text"] == ANSWER * 2 + " that", record
        assert record["finish_reason"] == "length" and record["completion_tokens"] == max_tokens
        # answer = completion - reasoning, as the server's usage has it: the markup counts as answer
        assert record["completion_tokens"] - record["reasoning_tokens"] == answer_tokens + 2
        # each channel's chunks: one token each, the markup's chunks carrying no text in either
        reasoning_len, text_len = record["chunk_reasoning_len"], record["chunk_text_len"]
        assert sum(n > 0 for n in reasoning_len) == THINKING_TOKENS and sum(reasoning_len) == len(THINKING)
        assert sum(n > 0 for n in text_len) == answer_tokens and sum(text_len) == len(record["text"])
        assert line["token_source"] == "usage" and line["decode_tokens_per_chunk"] == 1.0
        # TTFT is the `<think>` token's chunk, TTFA the first answer chunk's, the thinking span later
        # (in tokens; in time too, unless a starved API server flushed the whole reply in one burst)
        tokens, t_ms = record["chunk_tokens"], record["chunk_t_ms"]
        first_token = next(i for i, n in enumerate(tokens) if n > 0)
        first_answer = next(i for i, n in enumerate(text_len) if n > 0)
        assert tokens[first_answer] - tokens[first_token] == FIRST_ANSWER_AT
        assert line["ttft_ms"] == pytest.approx(t_ms[first_token])
        assert line["ttfa_ms"] == pytest.approx(t_ms[first_answer]) and line["ttfa_ms"] >= line["ttft_ms"]
        assert line["reasoning_tokens"] == THINKING_TOKENS and set(line["findings"]) <= TIMING_FINDINGS
        assert line["answer_tokens"] == answer_tokens + 2
        # each channel's ITL over its own gaps (None only where a starved server flushed it at once)
        for channel in ("reasoning_itl_ms", "answer_itl_ms"):
            assert line[channel] is None or line[channel] > 0, line
    summary = json.loads((folder / "summary.json").read_text())["variants"]["server"]
    assert set(summary["findings"]) <= TIMING_FINDINGS  # an answered reply is no truncation
    bench = summary["benchmark"]
    assert bench["ttft_ms"]["count"] == 2 and bench["ttfa_ms"]["count"] == 2
    assert bench["ttfa_ms"]["mean"] >= bench["ttft_ms"]["mean"]
    # both channels' totals (the markup counted with the answer, as the server's usage has it) and
    # gaps: 16 thinking gaps and 12 answer gaps a reply, one token each, the channel change in neither
    assert (bench["reasoning_tokens"], bench["answer_tokens"]) == (
        2 * THINKING_TOKENS,
        2 * (answer_tokens + 2),
    )
    assert bench["reasoning_itl_ms"]["count"] == 2 * (THINKING_TOKENS - 1)
    assert bench["answer_itl_ms"]["count"] == 2 * (answer_tokens - 1)
    rows = _rows(done.stdout)
    assert rows["Replies that reached an answer:"] == "2" and "reasoning_truncated" not in done.stdout
    assert rows["Reasoning tokens (server's count):"] == str(2 * THINKING_TOKENS)
    assert "Mean Answer token ITL (ms):" in rows
    assert float(rows["Mean TTFA (ms):"]) >= float(rows["Mean TTFT (ms):"])


def test_a_cap_inside_the_thinking_is_a_truncation(thinking_url: str, tmp_path: Path) -> None:
    max_tokens = 12  # `<think>` and 11 of the 17 thinking tokens
    folder = tmp_path / "run"
    done = _run(thinking_url, folder, max_tokens)
    records = _lines(folder / "requests.jsonl")
    derived = _lines(folder / "derived.jsonl")
    for record, line in zip(records, derived, strict=True):
        assert record["text"] == "" and THINKING.startswith(record["reasoning"]), record
        assert record["finish_reason"] == "length" and record["completion_tokens"] == max_tokens
        assert record["reasoning_tokens"] == max_tokens - 1  # all but `<think>`
        assert line["ttft_ms"] > 0 and line["ttfa_ms"] is None  # a first token, and no answer
        (cut,) = [f for f in line["finding_details"] if f["code"] == "reasoning_truncated"]
        assert cut["evidence"]["reasoning_tokens"] == max_tokens - 1
    summary = json.loads((folder / "summary.json").read_text())["variants"]["server"]
    assert summary["findings"]["reasoning_truncated"] == 2
    assert "reasoning_truncated" in done.stdout and "not comparable" in done.stdout
    # TTFT as vLLM counts it (either channel), and the answer's section beside it: none came
    bench = summary["benchmark"]
    assert bench["ttft_ms"]["count"] == 2 and bench["ttfa_ms"]["count"] == 0
    rows = _rows(done.stdout)
    assert rows["Replies that reached an answer:"] == "0" and rows["Mean TTFA (ms):"] == "n/a"
