"""Lossless at temperature > 0 (analysis/distribution.py): the simulator's bigram model scores its own
samples, K0 against K0 and against a correct K3 stays quiet, a K3 whose accepted drafts come from the
wrong distribution fires spec_decode_distribution_shift with its evidence."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from itlaudit.analysis.distribution import (
    ALPHA,
    MIN_EFFECT_NATS,
    ScoredOutput,
    distribution_shift,
    sampled,
)
from itlaudit.capture.scoring import Scorer
from itlaudit.model.codes import SPEC_DECODE_DISTRIBUTION_SHIFT
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status
from itlaudit.model.scenario import parse_scenario
from itlaudit.serve.sim import SimConfig, run_sim
from itlaudit.serve.sim.config import ARGMAX, FLAT
from itlaudit.serve.sim.lm import BigramModel
from itlaudit.side.client import SideClient
from itlaudit.store.rundir import COMPARE_FILE, read_json
from itlaudit.workflows.compare import run_compare
from tests.simkit import itlaudit, sim_server

SHARP = 2.0
PROMPTS = [
    "The decode step of a speculative model",
    "Write a short note on streaming tokens",
    "A draft model proposes and the target verifies",
    "Chunks of text arrive at the client",
]


def _sim(seed: int, k: int = 0, sampler: str = "model", dialect: str = "vllm") -> SimConfig:
    return SimConfig(
        dialect=dialect,
        model_sharpness=SHARP,
        num_speculative_tokens=k,
        draft_sampler=sampler,
        seed=seed,
        step_ms=0,
        ttft_ms=0,
    )


def _scenario(
    tmp_path: Path,
    urls: dict[str, str],
    requests: int = 24,
    tokens: int = 32,
    variants: str = "",
    endpoint: str = "completions",
) -> Any:
    """Sampled completions (temperature 0.8) of a few prompts; variants given by URL or as TOML."""
    variants += "".join(f'\n[[variants]]\nname = "{name}"\nurl = "{url}"\n' for name, url in urls.items())
    text = f"""
name = "dist"
endpoint = "{endpoint}"
model = "auto"
[workload]
prompts = {PROMPTS!r}
num_requests = {requests}
concurrency = 8
max_tokens = {tokens}
ignore_eos = true
temperature = 0.8
{variants}"""
    path = tmp_path / "dist.toml"
    path.write_text(text, "utf-8")
    return parse_scenario(text, path)


def _compare(
    tmp_path: Path, configs: dict[str, SimConfig], forced: bool | None = None, endpoint: str = "completions"
) -> dict[str, Any]:
    names = list(configs)
    with sim_server(configs[names[0]]) as first, sim_server(configs[names[1]]) as second:
        scenario = _scenario(tmp_path, {names[0]: first, names[1]: second}, endpoint=endpoint)
        _, comparison = run_compare(scenario, run_dir=tmp_path / "run", distribution=forced)
    return comparison


def _codes(comparison: dict[str, Any]) -> list[str]:
    return [f["code"] for f in comparison.findings]


# --- the simulator's model and its scoring endpoint ---------------------------------------------


async def test_sim_prompt_logprobs_are_the_models_log_probabilities() -> None:
    config = _sim(seed=1)
    model = BigramModel(config)
    async with run_sim(config) as url, SideClient() as client:
        scorer = Scorer(client, url, config.model)
        prompt_ids = await scorer.prompt_token_ids(PROMPTS[0])
        output = [40, 41, 300, 7]
        got = await scorer.output_logprobs(prompt_ids, output)
    ids = [*prompt_ids, *output]
    want = [model.logprob(ids[i - 1], ids[i]) for i in range(len(prompt_ids), len(ids))]
    assert got == pytest.approx(want)
    # A distribution: the logprobs after any token sum to 1, EOS and the special ids excluded.
    assert math.fsum(math.exp(model.logprob(40, t)) for t in range(3, config.vocab_size)) == pytest.approx(
        1.0
    )


async def test_sim_refuses_prompt_logprobs_on_a_stream_as_vllm_does() -> None:
    async with run_sim(_sim(seed=1)) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "a sentence to score", "stream": True, "prompt_logprobs": 0}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 400
            assert "prompt_logprobs" in (await resp.json())["error"]["message"]


def test_sim_without_a_model_keeps_its_uniform_tokens() -> None:
    """model_sharpness 0 (the default) leaves every existing simulator output as it was: the same
    seeded uniform draws, whatever the draft sampler says."""

    async def text(config: SimConfig) -> str:
        async with run_sim(config) as url, aiohttp.ClientSession() as session:
            body = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0.8, "seed": 5}
            async with session.post(url + "/v1/completions", json=body) as resp:
                return str((await resp.json())["choices"][0]["text"])

    plain = asyncio.run(text(SimConfig(step_ms=0, ttft_ms=0)))
    broken = asyncio.run(
        text(SimConfig(step_ms=0, ttft_ms=0, num_speculative_tokens=3, draft_sampler=ARGMAX))
    )
    assert plain == broken


# --- the rule on its own ------------------------------------------------------------------------


def _record(index: int, text: str = "some text", temperature: float | None = 0.8) -> RequestRecord:
    return RequestRecord(
        request_id=f"V-{index:05d}",
        variant="V",
        endpoint="completions",
        url="u",
        model="m",
        params=RequestParams(max_tokens=4, temperature=temperature),
        status=Status.OK,
        text=text,
        chunks=ChunkSeries(
            t_ms=[1.0, 2.0],
            completion_tokens=[1, 2],
            text_len=[1, 1],
            has_choice=[True, True],
            token_ids=[[5], [6]],
        ),
    )


def _scored(means: list[float]) -> list[ScoredOutput]:
    return [ScoredOutput(_record(i, f"text {i}"), (m, m)) for i, m in enumerate(means)]


def test_rule_fires_only_past_both_alpha_and_the_minimum_effect() -> None:
    base = _scored([-3.0 + 0.01 * i for i in range(20)])
    shifted = _scored([-2.0 + 0.01 * i for i in range(20)])
    figures, finding = distribution_shift("K0", "K3", base, shifted)
    assert finding is not None and finding.code == SPEC_DECODE_DISTRIBUTION_SHIFT
    assert figures["verdict"] == "shift" and figures["p_value"] < ALPHA
    assert figures["effect_nats"] == pytest.approx(1.0)
    assert figures["cliffs_delta"] == 1.0
    assert finding.evidence["worst"][0]["text"] == "text 19"  # most likely first: the shift is upwards
    # Significant but tiny (0.05 nats, under MIN_EFFECT_NATS): the same distribution for this audit.
    tiny = _scored([-2.95 + 0.0001 * i for i in range(20)])
    figures, finding = distribution_shift("K0", "K3", _scored([-3.0 + 0.0001 * i for i in range(20)]), tiny)
    assert abs(figures["effect_nats"]) < MIN_EFFECT_NATS and figures["p_value"] < ALPHA
    assert finding is None and figures["verdict"] == "same"


def test_rule_cannot_judge_a_handful_of_outputs() -> None:
    figures, finding = distribution_shift("K0", "K3", _scored([-3.0, -3.1, -3.2]), _scored([-1.0, -1.1]))
    assert finding is None and figures["verdict"] == "unknown" and figures["p_value"] is None


def test_only_finished_sampled_requests_are_scored() -> None:
    greedy, failed = _record(1, temperature=0), _record(2)
    failed.status = Status.HTTP_ERROR
    default = _record(3, temperature=None)  # unset: the server's default temperature samples
    assert sampled([greedy, failed, default, _record(4)]) == [default, _record(4)]


# --- compare, end to end on the simulator -------------------------------------------------------


def test_k0_against_k0_with_other_seeds_is_quiet(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, {"K0": _sim(seed=1), "K0b": _sim(seed=2)}, forced=True)
    row = comparison.distribution["variants"]["K0b"]
    assert row["verdict"] == "same", row
    assert row["n_base"] == row["n_spec"] == 24
    assert SPEC_DECODE_DISTRIBUTION_SHIFT not in _codes(comparison)


def test_correct_speculative_sampling_is_quiet_and_audited_without_asking(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, {"K0": _sim(seed=1), "K3": _sim(seed=2, k=3)})
    row = comparison.distribution["variants"]["K3"]
    assert row["verdict"] == "same", row
    assert SPEC_DECODE_DISTRIBUTION_SHIFT not in _codes(comparison)


@pytest.mark.parametrize(("sampler", "direction"), [(ARGMAX, 1), (FLAT, -1)])
def test_broken_speculative_sampling_fires(tmp_path: Path, sampler: str, direction: int) -> None:
    comparison = _compare(tmp_path, {"K0": _sim(seed=1), "K3": _sim(seed=2, k=3, sampler=sampler)})
    found = [f for f in comparison.findings if f["code"] == SPEC_DECODE_DISTRIBUTION_SHIFT]
    assert len(found) == 1, comparison.distribution
    evidence = found[0]["evidence"]
    assert evidence["p_value"] < ALPHA and direction * evidence["effect_nats"] > MIN_EFFECT_NATS
    assert evidence["spec_mean"] - evidence["base_mean"] == pytest.approx(evidence["effect_nats"])
    assert evidence["variant"] == "K3" and len(evidence["worst"]) == 3
    assert all(w["text"] for w in evidence["worst"])
    assert {"gibberish_share", "rep_3_mean"} <= set(evidence["spec_quality"])
    assert read_json(tmp_path / "run" / COMPARE_FILE)["distribution"]["variants"]["K3"]["verdict"] == "shift"


@pytest.mark.parametrize(("sampler", "verdict"), [("model", "same"), (ARGMAX, "shift")])
def test_sglang_generate_outputs_are_scored(tmp_path: Path, sampler: str, verdict: str) -> None:
    """On SGLang's /generate (~2 s each): the stream's output_ids are the record's token ids, so its
    sampled outputs are scored (on /generate, SGLangScorer): a correct K3 is the same, one whose
    accepted drafts are the argmax shifts."""
    configs = {
        "K0": _sim(seed=1, dialect="sglang"),
        "K3": _sim(seed=2, k=3, sampler=sampler, dialect="sglang"),
    }
    comparison = _compare(tmp_path, configs, endpoint="generate")
    row = comparison.distribution["variants"]["K3"]
    assert "skipped" not in comparison.distribution and row["n_base"] == row["n_spec"] == 24
    assert row["verdict"] == verdict, row
    assert (SPEC_DECODE_DISTRIBUTION_SHIFT in _codes(comparison)) is (verdict == "shift")


def test_no_speculation_means_no_audit_unless_asked(tmp_path: Path) -> None:
    comparison = _compare(tmp_path, {"K0": _sim(seed=1), "K0b": _sim(seed=2)})
    assert comparison.distribution is None


def test_a_launched_baseline_is_started_again_to_score(tmp_path: Path) -> None:
    """A baseline the run launched has stopped when the audit runs: it is launched once more (its own
    log beside the run's), scores, and stops; the broken K3 fires as with servers given by URL."""

    def launched(name: str, *flags: str) -> str:
        command = ["{python}", "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "0"]
        command += ["--ttft-ms", "0", "--model-sharpness", str(SHARP), *flags]
        return (
            f'\n[[variants]]\nname = "{name}"\n[variants.launch]\nkind = "command"\ncommand = {command!r}\n'
        )

    variants = launched("K0", "--seed", "1")
    variants += launched("K3", "--seed", "2", "--num-speculative-tokens", "3", "--draft-sampler", ARGMAX)
    scenario = _scenario(tmp_path, {}, requests=12, tokens=24, variants=variants)
    _, comparison = run_compare(scenario, run_dir=tmp_path / "run")
    assert SPEC_DECODE_DISTRIBUTION_SHIFT in _codes(comparison), comparison.get("distribution")
    assert (tmp_path / "run" / "server-K0-scoring.log").is_file()
    assert (tmp_path / "run" / "server-K0.log").is_file()


def test_cli_prints_the_audit_line(tmp_path: Path) -> None:
    with sim_server(_sim(seed=1)) as first, sim_server(_sim(seed=2, k=3, sampler=ARGMAX)) as second:
        path = _scenario(tmp_path, {"K0": first, "K3": second}, requests=16, tokens=24).path
        result = itlaudit("compare", str(path), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "K3: log-likelihood under K0" in result.stdout and ": shift" in result.stdout
    assert SPEC_DECODE_DISTRIBUTION_SHIFT in result.stdout
