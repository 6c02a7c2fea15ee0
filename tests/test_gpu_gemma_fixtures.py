"""The real model (Gemma 3 270M) in the GPU lane: CUDA vLLM 0.24.0 on an H200, replayed on CPU (issue 25).

tests/fixtures/gpu/gemma-h200/ holds `scripts/gpu/lane gemma` (2026-12-04, itlaudit at 96a9469): compare
G0 (eager) vs GNG (ngram K=3) vs GDM (the model as its own draft, K=3) on /v1/completions, 8 requests of
128 tokens at concurrency 4, greedy (`t0/`) and at temperature 0.8 / top_p 0.95 (`t08/`). Each folder
keeps the run's meta.json, summary.json, compare.json, tpot.md and requests.jsonl (`chunk_token_ids`
nulled in t08, which no mismatch audit reads) and the server's /metrics before and after, trimmed to
the spec-decode, TPOT and token counters. Its README says what the run
could not show: the tokenizer the box converted was character-level (one token per character), so the
weights were real but the text was not, and the tests below pin that too, so nobody reads these
figures as real-text ones.

tests/fixtures/gpu/gemma-h200-sound/ holds the rerun with the testbed's tokenizer laid over the box's
(`prepare --gemma` packs it, `lane gemmamodel` installs it): the `gemmaup` stage's greedy completions
from G0, GNG and GDM, checked against the testbed's own tokenization and greedy text. Its compares were
not rerun (device time), as its README says.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from gpukit import gpu_script, rederive

from itlaudit.model.scenario import load_scenario
from itlaudit.store.jsonl import load_records

GEMMA = Path(__file__).parent / "fixtures" / "gpu" / "gemma-h200"
SOUND = Path(__file__).parent / "fixtures" / "gpu" / "gemma-h200-sound"
SCENARIOS = Path(__file__).parents[1] / "scripts" / "gpu" / "scenarios"


def _rows(run: str) -> dict[str, Any]:
    return rederive(GEMMA / run)[1]["variants"]


@pytest.mark.parametrize("run", ["t0", "t08"])
def test_gemma_runs_rederive_to_what_the_device_wrote(run: str) -> None:
    summary, comparison = rederive(GEMMA / run)
    written = json.loads((GEMMA / run / "summary.json").read_text())
    for variant, block in written["variants"].items():
        for metric in ("itl_ms", "chunk_itl_ms", "tpot_ms", "ttft_ms", "completion_tokens"):
            for stat in ("count", "mean", "p50", "p99"):
                assert summary["variants"][variant][metric][stat] == pytest.approx(block[metric][stat])
        # gibberish_suspected was recalibrated on real text (826f295) after this run was written (GDM at
        # 0.8 had one); the letter-spaced text of this run is no evidence about it either way.
        rederived = summary["variants"][variant]["findings"]
        assert {k: n for k, n in rederived.items() if k != "gibberish_suspected"} == {
            k: n for k, n in block["findings"].items() if k != "gibberish_suspected"
        }, variant
    written_cmp = json.loads((GEMMA / run / "compare.json").read_text())
    for variant, row in written_cmp["variants"].items():
        assert comparison["variants"][variant]["speedup_token_itl"] == pytest.approx(row["speedup_token_itl"])
        assert comparison["variants"][variant]["spec_decode"] == row["spec_decode"]
    assert comparison["findings"] == written_cmp["findings"] == []


def test_greedy_spec_decode_is_lossless_on_gemma_and_ngram_is_the_chunk_itl_trap() -> None:
    """At temperature 0 all three servers wrote the same text for every prompt (no mismatch finding);
    ngram is 2.17× faster per token while its chunk ITL is larger than G0's: a chunk-counting tool would
    call it slower. The self-draft accepts every draft and is still slower (its draft is the target)."""
    records = load_records(GEMMA / "t0" / "requests.jsonl")
    # a record names no prompt; the four prompts' token counts differ, so the count stands for the prompt
    by_prompt: dict[tuple[int, str], set[str]] = {}
    for record in records:
        by_prompt.setdefault((record.prompt_tokens or 0, record.variant), set()).add(record.text or "")
    for prompt_tokens in {p for p, _ in by_prompt}:
        outputs = {v: by_prompt[(prompt_tokens, v)] for v in ("G0", "GNG", "GDM")}
        assert outputs["G0"] == outputs["GNG"] == outputs["GDM"] and len(outputs["G0"]) == 1
    rows = _rows("t0")
    g0, ng, dm = rows["G0"], rows["GNG"], rows["GDM"]
    assert (round(g0["itl_ms_p50"], 2), round(ng["itl_ms_p50"], 2), round(dm["itl_ms_p50"], 2)) == (
        39.14,
        18.01,
        42.87,
    )
    assert round(ng["speedup_token_itl"], 2) == 2.17
    assert ng["chunk_itl_ms_p50"] > g0["chunk_itl_ms_p50"]  # per chunk, ngram looks slower
    assert round(dm["speedup_token_itl"], 2) == 0.91
    assert dm["spec_decode"]["per_position_acceptance"] == [1.0, 1.0, 1.0]
    assert round(ng["spec_decode"]["acceptance_length"], 2) == 2.61
    assert round(ng["stream_acceptance_length"], 2) == 2.06


def test_sampled_gemma_acceptance_is_partial_for_ngram_and_for_the_self_draft() -> None:
    """At temperature 0.8 / top_p 0.95 ngram drafts only when an n-gram matches (tokens per drafting step
    2.20 in /metrics against 1.45 per decode chunk in the stream) and the self-draft, whose drafts would
    all be accepted were they sampled as the target samples, accepts 0.64 of them."""
    rows = _rows("t08")
    ng, dm = rows["GNG"]["spec_decode"], rows["GDM"]["spec_decode"]
    assert (round(ng["acceptance_length"], 2), round(rows["GNG"]["stream_acceptance_length"], 2)) == (
        2.2,
        1.45,
    )
    assert [round(p, 2) for p in ng["per_position_acceptance"]] == [0.52, 0.37, 0.32]
    assert round(dm["acceptance_rate"], 2) == 0.64
    assert [round(p, 2) for p in dm["per_position_acceptance"]] == [0.76, 0.62, 0.54]
    # The self-draft drafts every step, so the stream's tokens per decode chunk track /metrics closely.
    assert rows["GDM"]["stream_acceptance_length"] == pytest.approx(dm["acceptance_length"], rel=0.02)
    assert round(rows["GNG"]["speedup_token_itl"], 2) == 1.01
    assert round(rows["GDM"]["speedup_token_itl"], 2) == 0.83


def test_sampled_gemma_distribution_audit_stayed_quiet() -> None:
    """Both spec-decode variants' sampled outputs, scored under G0, were as likely as G0's own (8 against
    8 requests: a weak test, stated as such in docs/gpu-lane.md)."""
    block = json.loads((GEMMA / "t08" / "compare.json").read_text())["distribution"]
    assert block["scorer"] == "G0"
    verdicts = {
        v: (d["verdict"], round(d["p_value"], 2), round(d["effect_nats"], 2))
        for v, d in block["variants"].items()
    }
    assert verdicts == {"GNG": ("same", 0.46, -0.18), "GDM": ("same", 0.72, -0.06)}


@pytest.mark.parametrize(
    ("run", "expected", "extra"),
    [
        ("t0", {"G0": 0.01, "GNG": 0.0, "GDM": 0.01}, {"G0": 1, "GNG": 1, "GDM": 1}),
        # G0 also scored the three variants' sampled outputs (distribution audit) inside its window:
        # 36 prompt-logprob requests of one output token each, which the "excl." mean leaves out exactly.
        ("t08", {"G0": -0.01, "GNG": -0.01, "GDM": -0.0}, {"G0": 37, "GNG": 1, "GDM": 1}),
    ],
)
def test_gemma_tpot_matches_vllms_histogram(run: str, expected: dict, extra: dict) -> None:
    rows = {r["variant"]: r for r in gpu_script("tpot.py").compare(GEMMA / run, GEMMA / run / "metrics")}
    assert {v: round(r["diff_pct"], 2) for v, r in rows.items()} == expected
    assert {v: r["extra"] for v, r in rows.items()} == extra


def test_the_box_converted_tokenizer_was_character_level() -> None:
    """Every prompt cost one token per character plus <bos> (the testbed's conversion: 14 tokens for the
    72-character first prompt), so these runs measured real weights on character-split text. The lane's
    gemmamodel stage now lays the testbed's tokenizer over the box's and refuses a merge-less one."""
    prompts = load_scenario(SCENARIOS / "gemma-t0.toml").workload.prompts
    for run in ("t0", "t08"):
        counts = {r.prompt_tokens for r in load_records(GEMMA / run / "requests.jsonl")}
        assert counts == {len(p) + 1 for p in prompts}


# The testbed's conversion (transformers 5.19): "The capital of France is" is <bos> + 5 tokens, and its
# greedy continuation (CPU, bf16, 32 tokens); tests/fixtures/gpu/gemma-h200-sound/README.md says how.
TESTBED_PROMPT_TOKENS = 6
TESTBED_GREEDY = (
    " the capital of the country of France. It is the capital of the country of France. It is the"
    " capital of the country of France. It is the capital"
)


def test_with_the_testbeds_tokenizer_the_h200_writes_the_testbeds_text() -> None:
    """Rerun with the testbed's tokenizer files: every server counts the prompt as the testbed does (6
    tokens, not 25 characters + <bos>) and G0, ngram K3 and the self-draft K3 all write, greedily, the
    text the testbed's own CPU generation writes: real weights on real tokens, and lossless spec decode
    on real text."""
    replies = sorted(SOUND.glob("warm-*.json"))
    assert {p.stem.split("-")[1] for p in replies} == {"G0", "GNG", "GDM"} and len(replies) == 12
    for path in replies:
        reply = json.loads(path.read_text())
        assert reply["usage"]["prompt_tokens"] == TESTBED_PROMPT_TOKENS, path.name
        assert reply["usage"]["completion_tokens"] == 32, path.name
        assert reply["choices"][0]["text"] == TESTBED_GREEDY, path.name


def test_prepare_packs_the_tokenizer_files_and_names_a_folder_without_them(tmp_path: Path) -> None:
    prepare = gpu_script("prepare")
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text('{"model": {"merges": ["a b"]}}')
    with pytest.raises(SystemExit, match=r"lacks tokenizer_config\.json.*--gemma-tokenizer"):
        prepare.pack_tokenizer(model, tmp_path / "tok.tar.xz")
    (model / "tokenizer_config.json").write_text('{"add_bos_token": true}')
    entry = prepare.pack_tokenizer(model, tmp_path / "tok.tar.xz")
    packed = (tmp_path / "tok.tar.xz").read_bytes()
    assert entry == {"file": "tok.tar.xz", "sha256": hashlib.sha256(packed).hexdigest(), "from": str(model)}
    with tarfile.open(tmp_path / "tok.tar.xz", mode="r:xz") as tar:
        assert sorted(tar.getnames()) == ["tokenizer.json", "tokenizer_config.json"]
        member = tar.extractfile("tokenizer.json")
        assert member is not None and member.read() == (model / "tokenizer.json").read_bytes()


def test_prepare_splits_into_even_parts_that_fit_beside_the_checkout(tmp_path: Path) -> None:
    """Parts of equal size (the last at most as large), the fewest under the limit: 408 MB of vLLM and
    Gemma split at 50 MiB gives 8 parts of 48.7 MiB, which leave 15 MiB of a 64 MiB transfer to the
    checkout and the tokenizer."""
    prepare = gpu_script("prepare")
    blob = tmp_path / "site.tar.xz"
    blob.write_bytes(bytes(range(256)) * 41)  # 10496 bytes
    parts = prepare.split(blob, 4096)
    assert [p.stat().st_size for p in parts] == [3499, 3499, 3498]
    assert b"".join(p.read_bytes() for p in parts) == blob.read_bytes()
    # even a full part leaves room for the 8.4 MiB checkout and the 3.2 MiB tokenizer in one transfer
    assert prepare.PART_BYTES + 12 * 2**20 <= 64 * 2**20
