"""A real vLLM CPU server that bundles engine steps into one SSE chunk (`--stream-interval 4`, vLLM
0.32): without speculative decoding its chunks carry 4 tokens, which a reader of tokens per decode
chunk would take for an acceptance length. `compare` names it (stream_bundled, with the steps per
chunk); the quiet case, a default K0 and K3 on the same engine, is tests/test_vllm_integration.py's
compare (its compare.json findings are empty).

The same server, told to send no usage or token ids per chunk, is the case for --tokenizer (vllm bench's):
a chunk count reads its 4-token chunks as one token each; the model's tokenizer.json restores them.

CI cost: ~55 s (the server's start, ~30 s on 2 cores; a compare and three runs of 2 requests of 64
tokens, ~20 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import tiny_model, tiny_run, vllm_server

pytestmark = pytest.mark.vllm

bundled_url = vllm_server("--stream-interval", "4")


def test_a_k0_server_streaming_four_steps_a_chunk_is_named(bundled_url: str, tmp_path: Path) -> None:
    done = tiny_run("compare", bundled_url, tmp_path / "run")
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


# A stream that counts its tokens nowhere: vLLM sends usage on the last chunk only and no token ids.
UNCOUNTED = json.dumps({"stream_options": {"include_usage": True}, "return_token_ids": False})


def _run(url: str, out: Path, *extra: str) -> list[dict[str, object]]:
    """`itlaudit run` of 2 requests of 64 tokens (--ignore-eos); derived.jsonl's lines."""
    done = tiny_run("run", url, out, "--ignore-eos", *extra)
    assert (out / "derived.jsonl").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (out / "derived.jsonl").read_text().splitlines()]


def test_a_stream_without_counts_is_counted_by_the_local_tokenizer(bundled_url: str, tmp_path: Path) -> None:
    """vllm bench's --tokenizer, for a server that sends no usage or ids per chunk: counted by chunks,
    ~4 tokens a chunk read as one (token ITL = chunk ITL, usage_missing an error); with the model's own
    tokenizer, the tokens each chunk's text completed, scaled to the server's final total (the tiny random
    model's 64 tokens re-encode to 87-106); with usage sent, the tokenizer is not read. CI cost: ~15 s
    (three runs of 2 requests, on the module's server)."""
    tokenizer = str(tiny_model())
    for line in _run(bundled_url, tmp_path / "chunks", "--extra-body", UNCOUNTED):
        assert (line["token_source"], line["decode_tokens_per_chunk"]) == ("chunks", 1.0), line
        assert line["itl_ms"] == line["chunk_itl_ms"]
        assert ("usage_missing", "error") in [(f["code"], f["severity"]) for f in line["finding_details"]]
    with_usage = _run(bundled_url, tmp_path / "usage", "--tokenizer", tokenizer)
    local = _run(bundled_url, tmp_path / "local", "--extra-body", UNCOUNTED, "--tokenizer", tokenizer)
    for line, counted in zip(local, with_usage, strict=True):
        assert line["token_source"] == "tokenizer" and counted["token_source"] == "usage"
        assert "usage_missing" not in counted["findings"]
        # the bundles of ~4 tokens come back: within a token a chunk of the server's own counts
        assert abs(line["decode_tokens_per_chunk"] - counted["decode_tokens_per_chunk"]) < 1.0, (
            line,
            counted,
        )
        (missing,) = [f for f in line["finding_details"] if f["code"] == "usage_missing"]
        assert missing["severity"] == "warning" and "64 tokens" in missing["message"]
