"""Lossless spec-decode check: pure pairing rules, and K0 vs K3 simulators with a planted mismatch."""

from __future__ import annotations

import pytest

from itlaudit.analysis.lossless import (
    SPEC_DECODE_OUTPUT_MISMATCH,
    spec_decode_mismatches,
    with_divergence_logprobs,
    without_logprobs,
)
from itlaudit.capture.client import stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.capture.scoring import Scorer, explain_mismatch
from itlaudit.model.codes import Severity
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status
from itlaudit.serve.sim import SimConfig, run_sim
from itlaudit.side.client import SideClient

PROMPTS = ["The quick brown fox", "Speculative decoding proposes draft tokens"]


def _record(
    variant: str,
    index: int,
    ids: list[int] | None,
    *,
    text: str = "",
    finish: str = "length",
    temperature: float = 0.0,
) -> RequestRecord:
    chunks = ChunkSeries(t_ms=[1.0], completion_tokens=[None], text_len=[len(text)], has_choice=[True])
    chunks.token_ids = [ids]
    return RequestRecord(
        request_id=f"{variant}-{index:05d}",
        variant=variant,
        endpoint="completions",
        url="http://x",
        model="m",
        params=RequestParams(max_tokens=8, temperature=temperature),
        text=text,
        chunks=chunks,
        finish_reason=finish,
    )


def test_identical_greedy_outputs_are_quiet() -> None:
    base = [_record("K0", 0, [1, 2, 3]), _record("K0", 1, [4, 5])]
    spec = [_record("K3", 1, [4, 5]), _record("K3", 0, [1, 2, 3])]
    assert spec_decode_mismatches(base, spec) == []


def test_first_differing_token_is_reported() -> None:
    (finding,) = spec_decode_mismatches([_record("K0", 0, [1, 2, 3, 4])], [_record("K3", 0, [1, 2, 9, 4])])
    assert finding.code == SPEC_DECODE_OUTPUT_MISMATCH
    assert finding.request_id == "K3-00000"
    ev = finding.evidence
    assert (ev["unit"], ev["position"], ev["base_value"], ev["spec_value"]) == ("token", 2, 3, 9)
    assert ev["context_before"] == [1, 2]


def test_text_fallback_when_ids_are_missing() -> None:
    (finding,) = spec_decode_mismatches(
        [_record("K0", 0, None, text="hello world")], [_record("K3", 0, None, text="hello there")]
    )
    assert (finding.evidence["unit"], finding.evidence["position"]) == ("char", 6)


def test_early_stop_on_one_side_is_a_mismatch_but_a_length_cut_is_not() -> None:
    base = [_record("K0", 0, [1, 2, 3, 4])]
    (stopped,) = spec_decode_mismatches(base, [_record("K3", 0, [1, 2], finish="stop")])
    assert stopped.evidence["position"] == 2 and stopped.evidence["spec_value"] is None
    assert spec_decode_mismatches(base, [_record("K3", 0, [1, 2], finish="length")]) == []


def test_sampled_failed_and_unpaired_requests_are_skipped() -> None:
    base = [_record("K0", 0, [1, 2]), _record("K0", 1, [1, 2], temperature=0.7), _record("K0", 2, [1])]
    failed = _record("K3", 2, [7])
    failed.status = Status.HTTP_ERROR
    spec = [_record("K3", 1, [9, 9], temperature=0.7), failed, _record("K3", 3, [5])]
    assert spec_decode_mismatches(base, spec) == []


@pytest.mark.parametrize(
    ("base_top", "near_tie", "words"),
    [
        ({5: -1.0, 6: -1.05}, True, "ranks 2nd (margin 0.05 nats, replay disagrees): error."),
        ({5: -0.1, 6: -4.0}, False, "ranks 2nd (margin 3.9 nats, replay disagrees): error."),
        ({5: -0.1, 7: -3.0}, False, "ranks below its top 2 (margin 2.9 nats, replay disagrees): error."),
    ],
)
def test_divergence_logprobs_tell_variance_from_a_bug(
    base_top: dict[int, float], near_tie: bool, words: str
) -> None:
    (finding,) = spec_decode_mismatches([_record("K0", 0, [1, 5])], [_record("K3", 0, [1, 6])])
    explained = with_divergence_logprobs(finding, base_top, {6: -1.0, 5: -1.02})
    assert explained.evidence["near_tie"] is near_tie
    assert explained.evidence["base_top_logprobs"] == {str(k): v for k, v in base_top.items()}
    assert explained.evidence["spec_top_logprobs"] == {"6": -1.0, "5": -1.02}
    assert explained.message.endswith(
        f"Conclusion: the speculating server produced a token the baseline {words}"
    )
    assert explained.message.count("Conclusion:") == 1 and " or " not in explained.message


async def _records(url: str, variant: str, model: str) -> list[RequestRecord]:
    params = RequestParams(max_tokens=24, temperature=0.0)
    return [
        await stream_request(
            plan_request(
                base_url=url,
                endpoint="completions",
                model=model,
                prompt=prompt,
                params=params,
                request_id=f"{variant}-{i:05d}",
                variant=variant,
            )
        )
        for i, prompt in enumerate(PROMPTS)
    ]


async def test_sim_k0_vs_k3_match_and_a_planted_mismatch_is_found() -> None:
    async with (
        run_sim(SimConfig(ttft_ms=1, step_ms=0)) as k0,
        run_sim(SimConfig(ttft_ms=1, step_ms=0, num_speculative_tokens=3)) as k3,
        run_sim(SimConfig(ttft_ms=1, step_ms=0, num_speculative_tokens=3, natural_eos_at=7)) as bad,
    ):
        base = await _records(k0, "K0", "sim-tiny")
        assert spec_decode_mismatches(base, await _records(k3, "K3", "sim-tiny")) == []
        found = spec_decode_mismatches(base, await _records(bad, "K3", "sim-tiny"))
        assert [f.evidence["position"] for f in found] == [7, 7]
        assert all(f.evidence["spec_value"] == SimConfig().eos_token_id for f in found)
        async with SideClient() as client:
            explained = await explain_mismatch(
                found[0], PROMPTS[0], Scorer(client, k0, "sim-tiny"), Scorer(client, bad, "sim-tiny")
            )
    assert explained.evidence["base_top_logprobs"]
    assert next(iter(explained.evidence["spec_top_logprobs"])) == str(SimConfig().eos_token_id)


def test_a_near_tie_the_speculating_server_replays_as_k0_did_is_a_warning() -> None:
    """Replayed on its own, the K3 server ranks K=0's token first: its verification is exact, the live
    batch broke a tie. A replay that disagrees, or a wide margin, keeps the error."""
    (finding,) = spec_decode_mismatches([_record("K0", 0, [1, 5])], [_record("K3", 0, [1, 6])])
    agrees = with_divergence_logprobs(finding, {5: -1.0, 6: -1.125}, {5: -1.0, 6: -1.125})
    assert agrees.severity is Severity.WARNING
    assert agrees.message.endswith(
        "Conclusion: batch variance at a near tie (margin 0.125 nats, replay agrees): warning."
    )
    tied = with_divergence_logprobs(finding, {5: -1.0, 6: -1.0}, {6: -1.0, 5: -1.0})
    assert tied.severity is Severity.WARNING
    disagrees = with_divergence_logprobs(finding, {5: -1.0, 6: -1.125}, {6: -1.0, 5: -1.125})
    wide = with_divergence_logprobs(finding, {5: -0.1, 6: -4.0}, {5: -0.1, 6: -4.0})
    assert disagrees.severity is wide.severity is Severity.ERROR


def test_a_mismatch_no_server_could_score_says_it_is_not_concluded() -> None:
    """Launched servers stop after their variant: the mismatch says no conclusion was drawn and how to
    have one, at the registry's severity; its first form says the same before any scoring."""
    (finding,) = spec_decode_mismatches([_record("K0", 0, [1, 5])], [_record("K3", 0, [1, 6])])
    assert finding.message.endswith(
        "Conclusion: not drawn, the servers' top logprobs at the divergence were not read: error."
    )
    unscored = without_logprobs(finding)
    assert unscored.severity is Severity.ERROR and unscored.message.count("Conclusion:") == 1
    assert unscored.message.endswith(
        "give both servers by URL (--variant NAME=URL) so compare scores it: error."
    )
    scored = with_divergence_logprobs(finding, {5: -1.0, 6: -1.125}, {5: -1.0, 6: -1.125})
    assert without_logprobs(scored) == scored
