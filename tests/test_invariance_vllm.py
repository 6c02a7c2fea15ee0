"""All correctness audits against real vLLM 0.32 CPU servers, in one module so they share two server
starts (~50 s each): K0 for invariance, K0 vs K3 self-draft for lossless spec decode and for the
quality rule on the real engine's digit soup."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from simkit import itlaudit
from vllm_server import SERVED_MODEL, vllm_server

from itlaudit.analysis.invariance import prompt_figures, summarize
from itlaudit.analysis.lossless import spec_decode_mismatches
from itlaudit.capture.client import stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.capture.scoring import Scorer, explain_mismatch, observe
from itlaudit.model.records import RequestParams, RequestRecord, Status
from itlaudit.side.client import SideClient

pytestmark = pytest.mark.vllm
k0_url = vllm_server()
k3_url = vllm_server(num_speculative_tokens=3)

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Answer A or B:",
    "Speculative decoding proposes draft tokens and verifies them in one forward pass.",
    "Once upon a time",
]
REPEATS = 40


async def test_real_invariance_figures_are_reported_consistently(k0_url: str) -> None:
    async with SideClient() as client:
        scorer = Scorer(client, k0_url, SERVED_MODEL)
        observations = [await observe(scorer, p, REPEATS, concurrent=True) for p in PROMPTS[:2]]
    summary = summarize([prompt_figures(o) for o in observations])
    print("real vLLM 0.32 CPU invariance:", json.dumps(summary))
    batches = summary["batch2_batches"]
    assert batches == REPEATS * 2
    for key in ("alone_repeat", "alone_vs_batch2", "batch2_repeat"):
        assert summary[key] >= 0.0
    # Whatever the CPU does, the counts and the deltas must tell the same story.
    assert (summary["batch2_identical_to_alone"] == batches) == (
        summary["alone_vs_batch2"] == 0.0 and summary["top_set_diff_alone_vs_batch2"] == 0
    )
    assert summary["batch2_identical_to_alone"] <= summary["batch2_rows_identical"] <= batches
    if summary["alone_vs_batch2"] == 0.0:
        assert summary["decision_flip_rate"] == 0.0
    sweep = summary["sweep"]
    assert sweep["invariant"] == all(delta == 0.0 for delta in sweep["max_delta"].values())


async def _greedy_records(url: str, variant: str) -> list[RequestRecord]:
    params = RequestParams(max_tokens=48, ignore_eos=True, temperature=0.0)
    return [
        await stream_request(
            plan_request(
                base_url=url,
                endpoint="completions",
                model=SERVED_MODEL,
                prompt=prompt,
                params=params,
                request_id=f"{variant}-{i:05d}",
                variant=variant,
            )
        )
        for i, prompt in enumerate(PROMPTS)
    ]


async def test_real_k3_self_draft_is_lossless_at_temperature_0(k0_url: str, k3_url: str) -> None:
    base = await _greedy_records(k0_url, "K0")
    spec = await _greedy_records(k3_url, "K3")
    assert all(r.status == Status.OK and r.completion_tokens == 48 for r in base + spec)
    found = spec_decode_mismatches(base, spec)
    if found:  # show both servers' candidates at the divergence, so a failure explains itself
        async with SideClient() as client:
            scorers = Scorer(client, k0_url, SERVED_MODEL), Scorer(client, k3_url, SERVED_MODEL)
            index = int(found[0].evidence["prompt_index"])
            explained = await explain_mismatch(found[0], PROMPTS[index], *scorers)
        pytest.fail(f"{explained.message} evidence: {json.dumps(explained.evidence)}")
    print("real vLLM 0.32 CPU lossless: K0 == K3 on", len(PROMPTS), "prompts × 48 tokens")


def test_digit_soup_on_both_real_servers_is_compared_with_the_phrase(
    k0_url: str, k3_url: str, tmp_path: Path
) -> None:
    """The real engine made to write digit soup (vLLM's `allowed_token_ids`: the digits and a space, the
    way a dummy-weight model's text trips the quality rule): K0 and K3 both write gibberish, so compare
    gives K3's token-ITL ratio and says "outputs are gibberish in both variants: speed compared, quality
    not judged" (issue 34's done-when, on the two servers this module already holds: ~20 s)."""
    ask = json.dumps({"model": SERVED_MODEL, "prompt": " 0 1 2 3 4 5 6 7 8 9"}).encode()
    request = urllib.request.Request(f"{k0_url}/tokenize", ask, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        allowed = sorted(set(json.load(answer)["tokens"]))
    scenario = tmp_path / "digits.toml"
    scenario.write_text(
        f'name = "digits"\nendpoint = "completions"\nmodel = "{SERVED_MODEL}"\n[workload]\n'
        'prompts = ["Count for me:"]\nnum_requests = 3\nmax_tokens = 256\nignore_eos = true\n'
        "temperature = 0\n"
        f"[workload.extra_body]\nallowed_token_ids = {allowed}\n"
        f'[[variants]]\nname = "K0"\nurl = "{k0_url}"\n[[variants]]\nname = "K3"\nurl = "{k3_url}"\n'
    )
    out = tmp_path / "run"
    done = itlaudit("compare", str(scenario), "--out", str(out), "--no-plots", "--no-distribution-audit")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    for name in ("K0", "K3"):
        assert summary["variants"][name]["findings"].get("gibberish_suspected") == 3, summary["variants"][
            name
        ]
    compared = json.loads((out / "compare.json").read_text())
    phrase = "outputs are gibberish in both variants: speed compared, quality not judged"
    assert compared["variants"]["K3"]["not_comparable"] is None and compared["quality"] == phrase
    assert re.search(r"K3: token-ITL speedup \d+\.\d\d×", done.stdout) and f"quality: {phrase}" in done.stdout
    assert phrase in (out / "report.md").read_text()
