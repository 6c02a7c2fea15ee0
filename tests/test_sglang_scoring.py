"""Scoring an SGLang server (issue 41): its /v1/completions keys logprob candidates by token text and
drops vLLM's `return_tokens_as_token_ids` and `prompt_logprobs`, so the invariance audit, compare's
mismatch explanation and the distribution audit score SGLang on /generate (capture/scoring.py's
SGLangScorer, chosen from the server's identity). All against `itlaudit sim --dialect sglang`, whose
layouts are SGLang 0.5.12.post1's (serve/sim/sglang.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from simkit import app_on_thread, itlaudit, sim_server

from itlaudit.analysis.invariance import parse_top_logprobs
from itlaudit.capture.scoring import Scorer, SGLangScorer, scorer_for
from itlaudit.errors import ServerRejectedError
from itlaudit.model.codes import SPEC_DECODE_OUTPUT_MISMATCH, Severity
from itlaudit.serve.sim import SimConfig, run_sim
from itlaudit.serve.sim.lm import BigramModel
from itlaudit.serve.sim.server import make_app
from itlaudit.side.client import SideClient

SGLANG = SimConfig(dialect="sglang", ttft_ms=1, step_ms=0)


async def test_sglang_completions_key_candidates_by_text_so_the_vllm_scorer_refuses() -> None:
    """SGLang's /v1/completions (~0.3 s): candidates keyed by text, text_offset -1, vLLM's options
    ignored; read as vLLM's, it is refused with words that name SGLang. The identity picks /generate."""
    async with run_sim(SGLANG) as url, SideClient() as client:
        vllm = Scorer(client, url, "sim-tiny", top_k=3)
        body = await vllm.complete("The quick brown fox", 2, prompt_logprobs=0)
        picked = await scorer_for(client, url, "sim-tiny")
    logprobs = body["choices"][0]["logprobs"]
    assert not any(key.startswith("token_id:") for top in logprobs["top_logprobs"] for key in top)
    assert logprobs["text_offset"] == [-1, -1] and "prompt_logprobs" not in body["choices"][0]
    with pytest.raises(ServerRejectedError, match="SGLang's /v1/completions keys candidates by text"):
        parse_top_logprobs(body)
    assert type(picked) is SGLangScorer


async def test_generate_sends_logprobs_as_sglang_does() -> None:
    """/generate's layout (~0.3 s): a `text` list is answered as a list; each row's
    output_top_logprobs are [logprob, token_id, None] best first, the input ones from
    logprob_start_len on with None first; return_text_in_logprobs fills the text."""
    config = SimConfig(dialect="sglang", ttft_ms=1, step_ms=0, model_sharpness=2.0)
    async with run_sim(config) as url, SideClient() as client:
        body = {
            "text": ["a b c", "a b c"],
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True,
            "top_logprobs_num": 3,
            "logprob_start_len": 1,
        }
        rows = (await client.request("POST", f"{url}/generate", body=body)).checked().json()
        texted = await client.post_json(
            f"{url}/generate", {"text": "a b c", "return_logprob": True, "return_text_in_logprobs": True}
        )
    assert isinstance(rows, list) and len(rows) == 2 and rows[0]["output_ids"] == rows[1]["output_ids"]
    meta = rows[0]["meta_info"]
    tops = meta["output_top_logprobs"]
    assert len(tops) == 2 and all(len(position) == 3 for position in tops)
    assert all(entry[2] is None and isinstance(entry[1], int) for entry in tops[0])
    assert [entry[0] for entry in tops[0]] == sorted((entry[0] for entry in tops[0]), reverse=True)
    assert [entry[1] for entry in meta["output_token_logprobs"]] == rows[0]["output_ids"]
    prompt = meta["input_token_logprobs"]
    assert prompt[0][0] is None and meta["input_top_logprobs"][0] is None
    lm = BigramModel(config)
    assert prompt[1][0] == pytest.approx(lm.logprob(prompt[0][1], prompt[1][1]))
    assert all(isinstance(entry[2], str) for entry in texted["meta_info"]["output_token_logprobs"])
    assert texted["meta_info"]["input_token_logprobs"] == []  # logprob_start_len -1: none of the prompt


async def test_sglang_scorer_scores_outputs_as_the_vllm_one_does() -> None:
    """The distribution audit's two questions on /generate (~0.3 s): the prompt's ids and each output
    token's log p under the model, the same figures the vLLM dialect gives for the same ids."""
    config = {"ttft_ms": 1, "step_ms": 0, "model_sharpness": 2.0}
    prompt, output = "Chunks of text arrive at the client", [40, 41, 300, 7]
    async with (
        run_sim(SimConfig(dialect="sglang", **config)) as sgl,
        run_sim(SimConfig(**config)) as vllm,
        SideClient() as client,
    ):
        got = []
        for url in (sgl, vllm):
            scorer = await scorer_for(client, url, "sim-tiny")
            ids = await scorer.prompt_token_ids(prompt)
            got.append((type(scorer), ids, await scorer.output_logprobs(ids, output)))
    assert got[0][0] is SGLangScorer and got[1][0] is Scorer
    assert got[0][1] == got[1][1]
    assert got[0][2] == pytest.approx(got[1][2])


@pytest.mark.parametrize(("variance", "flagged"), [(0.0, False), (0.2, True)])
def test_invariance_command_against_sglang(tmp_path: Path, variance: float, flagged: bool) -> None:
    """`itlaudit invariance` on an SGLang server (~1 s each): scored on /generate, batches as `text`
    lists; clean is invariant, the batch-variance fault is flagged."""
    with sim_server(SimConfig(dialect="sglang", ttft_ms=1, step_ms=0, batch_variance=variance)) as url:
        result = itlaudit("invariance", "--url", url, "-n", "3", "--prompt", "a b c", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert ("NOT batch-invariant" in result.stdout) is flagged
    variant = json.loads((tmp_path / "invariance.json").read_text())["url"]
    assert variant["server"]["version"].startswith("sglang ")
    assert (variant["summary"]["alone_vs_batch2"] > 0) is flagged
    assert variant["summary"]["batch2_identical_to_alone"] == (0 if flagged else 3)


def _refusing_logprobs(config: SimConfig) -> web.Application:
    """The SGLang simulator behind a gateway that refuses logprobs: a /generate asking for them is
    answered 403, a plain stream passes."""
    app = make_app(config)

    @web.middleware
    async def no_logprobs(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/generate" and (await request.json()).get("return_logprob"):
            raise web.HTTPForbidden(
                text='{"detail": "logprobs are not allowed"}', content_type="application/json"
            )
        return await handler(request)

    app.middlewares.append(no_logprobs)
    return app


K3_ENDS_EARLY = SimConfig(dialect="sglang", ttft_ms=1, step_ms=0, num_speculative_tokens=3, natural_eos_at=7)


@pytest.mark.parametrize("refusing", [False, True])
def test_compare_on_sglang_finds_its_mismatch_by_token(tmp_path: Path, refusing: bool) -> None:
    """`itlaudit compare` of two SGLang servers on /generate (~0.7 s each): the streams' output_ids are
    kept (capture/chunk.py's GenerateDecoder), so the mismatch is found by token at position 7 and
    re-scored on both servers' /generate: explained, K3 ranking EOS first there; with K3 behind the
    gateway refusing logprobs, kept unexplained with its scoring_error, compare.json written all the
    same."""
    k3_app = _refusing_logprobs(K3_ENDS_EARLY) if refusing else make_app(K3_ENDS_EARLY)
    with sim_server(SGLANG) as k0_url, app_on_thread(k3_app) as k3_url:
        scenario = tmp_path / "s.toml"
        scenario.write_text(
            'name = "sgl-lossless"\nendpoint = "generate"\n\n[workload]\nprompts = ["a b c"]\n'
            "num_requests = 2\nconcurrency = 1\nmax_tokens = 12\ntemperature = 0\n\n"
            f'[[variants]]\nname = "K0"\nurl = "{k0_url}"\n\n[[variants]]\nname = "K3"\nurl = "{k3_url}"\n',
            encoding="utf-8",
        )
        out = tmp_path / "run"
        result = itlaudit(
            "compare", str(scenario), "--out", str(out), "--no-plots", "--no-distribution-audit"
        )
    assert result.returncode == 0, result.stderr
    compared = json.loads((out / "compare.json").read_text())
    found = [f for f in compared["findings"] if f["code"] == SPEC_DECODE_OUTPUT_MISMATCH]
    evidence = [f["evidence"] for f in found]
    assert len(found) == 2 and all(e["unit"] == "token" and e["position"] == 7 for e in evidence)
    if refusing:  # it stands at its severity, and its conclusion says it was not explained and why
        assert all(f["severity"] == Severity.ERROR for f in found)
        assert all("403" in str(e["scoring_error"]) and "base_top_logprobs" not in e for e in evidence)
        assert all("logprobs are not allowed" in str(e["scoring_error"]) for e in evidence)
        assert all(f["message"].count("Conclusion:") == 1 for f in found)
        assert all("were not read: scoring them failed (" in f["message"] for f in found)
    else:
        assert all("scoring_error" not in e for e in evidence)
        assert all(next(iter(e["spec_top_logprobs"])) == str(SimConfig().eos_token_id) for e in evidence)
        assert all(e["base_top_logprobs"] and "not drawn" not in str(e["conclusion"]) for e in evidence)
