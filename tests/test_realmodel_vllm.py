"""Every per-request and comparison audit on a real trained model: Gemma 3 270M on the vLLM CPU testbed.

The tiny random-weight models never stop on EOS, write gibberish by construction and accept every
self-draft; these tests meet the audits with the cases they exist for. Servers come from gemmakit's
session fixture (one per variant, started on first use); requests are few and short (~71 ms a token).

The firing cases of ignore_eos / min_tokens / stop_token_ids use the same real server behind
gemmakit.dropping_proxy, which deletes the field from the request: real text, real EOS, a server that
does not honour what the client asked (the client's record still holds what it asked).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from gemmakit import EOS_IDS, SERVED_MODEL, GemmaServers, capture, dropping_proxy

from itlaudit.analysis.findings import request_findings
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.request_acceptance import server_acceptance
from itlaudit.model.records import RequestParams, RequestRecord
from itlaudit.store.jsonl import load_records
from itlaudit.store.server_metrics import read_server_metrics

pytestmark = pytest.mark.vllm

# Sampled (temperature 0.8, top_p 0.95) with a seed, so the same server repeats a sample; greedy output
# of this base model loops and rarely stops. A seed's sample is not the same on every server, though (a
# fresh one, or one batching other requests, computes slightly different logits): the fixture below
# looks for a seed whose sample ends on EOS, on the server the tests then use, one request at a time.
NATURAL_PROMPT = "Tweet: Just finished my morning run"
SAMPLED = {"top_p": 0.95}
MAX_TOKENS = 96
SEEDS = range(16)  # measured: about 1 seed in 3 stops within 96 tokens
FREE_TEXT = [
    "The history of the printing press begins in the fifteenth century, when",
    "Photosynthesis is the process by which plants",
]
# Timing warnings a starved 2-core box raises truthfully; not what these tests are about.
TIMING = {"chunks_coalesced", "client_saturated"}


def _codes(record: RequestRecord) -> set[str]:
    return {f.code for f in request_findings(record, request_metrics(record))} - TIMING


def _natural(url: str, params: RequestParams) -> RequestRecord:
    return capture(url, NATURAL_PROMPT, params, extra_body=SAMPLED)


@pytest.fixture(scope="module")
def natural(gemma: GemmaServers) -> RequestRecord:
    """A seeded sample without any stop control that ends on EOS well before max_tokens: where the
    model stops by itself. Its params are the ones the other tests vary."""
    for seed in SEEDS:
        params = RequestParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=seed)
        record = _natural(gemma.url("K0"), params)
        if record.finish_reason == "stop" and (record.completion_tokens or MAX_TOKENS) < MAX_TOKENS - 16:
            return record
    raise AssertionError(f"no seed in {SEEDS} made {NATURAL_PROMPT!r} end on EOS within {MAX_TOKENS} tokens")


def test_natural_eos_stop_is_not_truncation(natural: RequestRecord) -> None:
    assert natural.stop_reason in (None, *EOS_IDS)
    assert _codes(natural) == set()


def test_ignore_eos_honoured_is_quiet_and_dropped_fires(gemma: GemmaServers, natural: RequestRecord) -> None:
    honoured = _natural(gemma.url("K0"), replace(natural.params, ignore_eos=True))
    assert honoured.finish_reason == "length" and honoured.completion_tokens == MAX_TOKENS
    assert _codes(honoured) == set()
    with dropping_proxy(gemma.url("K0"), ("ignore_eos",)) as proxy:
        dropped = _natural(proxy, replace(natural.params, ignore_eos=True))
    assert dropped.finish_reason == "stop" and dropped.completion_tokens == natural.completion_tokens
    assert _codes(dropped) == {"ignore_eos_violated"}


def test_min_tokens_honoured_is_quiet_and_dropped_fires(gemma: GemmaServers, natural: RequestRecord) -> None:
    assert natural.completion_tokens is not None
    floor = natural.completion_tokens + 16
    honoured = _natural(gemma.url("K0"), replace(natural.params, min_tokens=floor))
    assert honoured.completion_tokens is not None and honoured.completion_tokens >= floor
    assert _codes(honoured) == set()
    with dropping_proxy(gemma.url("K0"), ("min_tokens",)) as proxy:
        dropped = _natural(proxy, replace(natural.params, min_tokens=floor))
    assert dropped.completion_tokens == natural.completion_tokens
    assert _codes(dropped) == {"min_tokens_violated"}


def test_stop_token_ids_honoured_is_quiet_and_dropped_fires(
    gemma: GemmaServers, natural: RequestRecord
) -> None:
    ids = [i for chunk in natural.chunks.token_ids if chunk for i in chunk]
    # A token the sample reaches after a few tokens, for the first time, and well before its end.
    stop_id = next(tok for pos, tok in enumerate(ids[:-2]) if pos >= 3 and tok not in ids[:pos])
    honoured = _natural(gemma.url("K0"), replace(natural.params, stop_token_ids=[stop_id]))
    assert honoured.finish_reason == "stop" and honoured.stop_reason == stop_id
    assert _codes(honoured) == set()
    with dropping_proxy(gemma.url("K0"), ("stop_token_ids",)) as proxy:
        dropped = _natural(proxy, replace(natural.params, stop_token_ids=[stop_id]))
    assert _codes(dropped) == {"stop_token_ids_ignored"}


def _compare(tmp_path: Path, urls: dict[str, str], prompts: list[str], max_tokens: int) -> dict:
    """`itlaudit compare` over running servers (url variants): the project's own lossless and acceptance
    audits, at temperature 0, two requests a variant, one at a time. The run folder is tmp_path/cmp."""
    variants = "".join(f'\n[[variants]]\nname = "{name}"\nurl = "{url}"\n' for name, url in urls.items())
    scenario = tmp_path / "gemma.toml"
    scenario.write_text(
        f'name = "gemma"\nendpoint = "completions"\nmodel = "{SERVED_MODEL}"\n\n[workload]\n'
        f"prompts = {json.dumps(prompts)}\nnum_requests = {len(prompts)}\nconcurrency = 1\n"
        f"max_tokens = {max_tokens}\ntemperature = 0\n{variants}"
    )
    out = tmp_path / "cmp"
    result = subprocess.run(
        [sys.executable, "-m", "itlaudit", "compare", str(scenario), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "compare.json").read_text())


def test_ngram_on_free_text_partial_acceptance_agrees_with_metrics_and_is_lossless(
    gemma: GemmaServers, tmp_path: Path
) -> None:
    urls = dict(zip(("K0", "ngram-K3"), gemma.urls("K0", "ngram-K3"), strict=True))
    comparison = _compare(tmp_path, urls, FREE_TEXT, 64)
    assert comparison["findings"] == []  # no spec_decode_output_mismatch, no acceptance_length_mismatch
    # Issue 27's done-when on a real model: /metrics sampled through each variant's window, the server's
    # own acceptance on every speculating request (the launcher asks for it), the timeline drawn.
    out = tmp_path / "cmp"
    sampled = read_server_metrics(out)
    assert set(sampled) == set(urls) and all(sampled.values()), {k: len(v) for k, v in sampled.items()}
    records = [r for r in load_records(out / "requests.jsonl") if r.variant == "ngram-K3" and not r.warmup]
    assert len(records) == len(FREE_TEXT) and all(server_acceptance(r) for r in records)
    assert (out / "server_timeline.png").stat().st_size > 0
    assert "(server_timeline.png)" in (out / "report.md").read_text()
    ngram = comparison["variants"]["ngram-K3"]
    spec = ngram["spec_decode"]
    # Partial acceptance: ngram drafts from the context, which free text repeats only in part.
    assert 0.05 < spec["acceptance_rate"] < 0.98, spec
    assert 1.0 < spec["acceptance_length"] < 4.0
    per_pos = spec["per_position_acceptance"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[-1], per_pos
    # The stream's accepted tokens are /metrics' (ngram may skip drafting, so the lengths may differ).
    assert (
        abs(ngram["stream_accepted_tokens"] - spec["num_accepted_tokens"])
        <= 0.1 * spec["num_accepted_tokens"]
    )


def test_draft_model_is_lossless_at_temperature_zero(gemma: GemmaServers, tmp_path: Path) -> None:
    urls = dict(zip(("K0", "draft-K3"), gemma.urls("K0", "draft-K3"), strict=True))
    comparison = _compare(tmp_path, urls, FREE_TEXT[:1], 48)
    assert comparison["findings"] == []
    spec = comparison["variants"]["draft-K3"]["spec_decode"]
    assert spec["acceptance_rate"] > 0.9  # the model drafts for itself: greedy drafts are its own choice
