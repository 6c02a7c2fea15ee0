"""SGLang's dialect (issue 41 item 1) against the simulator speaking it (`--dialect sglang`): the native
/generate stream, its OpenAI streams with usage only at the end or on every chunk, identity from its
info endpoints, its sglang:* metrics, and its per-request acceptance. No SGLang server runs here (there
is no CPU wheel); the simulator's layouts are read from SGLang's sources (serve/sim/sglang.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from simkit import app_on_thread, itlaudit, sim_server

from itlaudit.analysis.lossless import output_token_ids
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.request_acceptance import server_acceptance
from itlaudit.analysis.server_metrics import delta_row, parse_scrape, summarize_series
from itlaudit.analysis.stream_rules import usage_missing_finding
from itlaudit.capture.chunk import GenerateDecoder
from itlaudit.capture.request_plan import build_body
from itlaudit.capture.server_info import environment_record
from itlaudit.capture.sse import SSEFramer
from itlaudit.errors import ServerStatusError
from itlaudit.model.codes import SPEC_DECODE_METRICS_DISAGREE, USAGE_MISSING
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestParams, RequestRecord
from itlaudit.model.run_context import server_build
from itlaudit.model.vocabulary import Endpoint
from itlaudit.serve.sim import SIM_VERSION, SimConfig, run_sim
from itlaudit.side.client import SideClient
from itlaudit.store.jsonl import load_records


def _run(config: SimConfig, tmp_path: Path, endpoint: str) -> Path:
    """`itlaudit run` (in-process, no plots) of 4 requests of 48 tokens on `endpoint`; the run folder."""
    with sim_server(config) as url:
        scenario = tmp_path / "s.toml"
        workload = (
            'prompts = ["Tell me a story about a cat."]\nnum_requests = 4\nconcurrency = 2\nmax_tokens = 48'
        )
        scenario.write_text(
            f'name = "sg"\nendpoint = "{endpoint}"\n\n[workload]\n{workload}\n\n'
            f'[[variants]]\nname = "k3"\nurl = "{url}"\n',
            encoding="utf-8",
        )
        out = tmp_path / "run"
        result = itlaudit("run", str(scenario), "--out", str(out), "--metrics-period", "0.05", "--no-plots")
    assert result.returncode == 0, result.stderr
    return out


def _findings(out: Path, code: str) -> list[dict[str, object]]:
    lines = (out / "derived.jsonl").read_text().splitlines()
    return [f for line in lines for f in json.loads(line)["finding_details"] if f["code"] == code]


SPECULATING = SimConfig(dialect="sglang", num_speculative_tokens=3, acceptance_prob=0.5)


@pytest.mark.parametrize("incremental", [False, True])
def test_the_native_generate_stream_gives_token_counts_per_chunk_and_acceptance(
    tmp_path: Path, incremental: bool
) -> None:
    """/generate against SGLang's layout (~1 s each), its text and output_ids cumulative or, with
    --incremental-streaming-output, in pieces: tokens from meta_info.completion_tokens (no
    usage_missing), several per chunk under K=3, each chunk's new ids as many as its tokens, the text
    rebuilt, the request's spec_* kept and agreeing with the stream, the sglang:* gauges read as KV
    usage, running and acceptance, and the server named SGLang (the simulator's, so simulated)."""
    out = _run(replace(SPECULATING, sglang_incremental_output=incremental), tmp_path, "generate")
    records = load_records(out / "requests.jsonl")
    assert len(records) == 4 and all(
        r.completion_tokens == 48 and r.finish_reason == "length" for r in records
    )
    for record in records:
        counts = [c for c in record.chunks.completion_tokens if c is not None]
        assert counts == sorted(counts) and counts[-1] == 48 and len(counts) < 48  # >1 token a chunk
        ids = [len(chunk or []) for chunk in record.chunks.token_ids]
        assert ids == [now - before for before, now in itertools.pairwise([0, *counts])]
        assert len(output_token_ids(record) or []) == 48
        verify = record.spec_decode["spec_verify_ct"] if record.spec_decode else None
        assert isinstance(verify, int) and verify > 0
        assert len(record.text) > 0
    assert not _findings(out, USAGE_MISSING) and not _findings(out, SPEC_DECODE_METRICS_DISAGREE)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"]["k3"]["token_source"] == {"usage": 4}
    server = summary["server"]["k3"]
    assert server["kv_usage_max"] > 0 and server["running_max"] >= 1
    assert server["gauge_acceptance_length_p50"] > 1 and server["gen_throughput_p50"] > 0
    assert 1 < server["server_acceptance_length"] <= 4 and server["server_k"] == 3
    environment = json.loads((out / "meta.json").read_text())["variants"]["k3"]["environment"]
    assert environment["server_version"] == f"sglang {SIM_VERSION}"
    assert environment["simulated"] is True and environment["vllm_version"] is None


def test_sglang_acceptance_that_lies_is_a_finding(tmp_path: Path) -> None:
    """The per-request spec_* claim every draft while half were accepted (~3 s): the finding fires on
    each request, with SGLang's reported length in its evidence."""
    config = SimConfig(dialect="sglang", num_speculative_tokens=3, acceptance_prob=0.5, spec_metrics_lie=True)
    found = _findings(_run(config, tmp_path, "generate"), SPEC_DECODE_METRICS_DISAGREE)
    assert len(found) == 4
    evidence = found[0]["evidence"]
    assert isinstance(evidence, dict) and evidence["server_accepted"] == 3 * evidence["server_steps"]
    assert evidence["server_acceptance_length"] is not None


def test_openai_stream_with_usage_only_at_the_end_says_so(tmp_path: Path) -> None:
    """An SGLang build that ignores continuous_usage_stats (~3 s): the total comes in the last chunk,
    so the chunks are counted and the finding says the usage came only at the end, with the total."""
    out = _run(SimConfig(dialect="sglang"), tmp_path, "completions")
    found = _findings(out, USAGE_MISSING)
    assert len(found) == 4
    assert "usage came only at the end (48 tokens, in its last chunk)" in str(found[0]["message"])
    assert "cannot be spread over chunks" in str(found[0]["message"])
    evidence = found[0]["evidence"]
    assert isinstance(evidence, dict) and evidence["usage_at_end_only"] is True
    assert evidence["token_source"] == "chunks" and evidence["final_completion_tokens"] == 48


def test_openai_stream_with_continuous_usage_is_token_true(tmp_path: Path) -> None:
    """An SGLang build that honours continuous_usage_stats (~3 s): usage on every chunk, no finding;
    its matched_stop would be the record's stop_reason (none here: every reply hits the length)."""
    out = _run(SimConfig(dialect="sglang", sglang_continuous_usage=True), tmp_path, "chat")
    assert not _findings(out, USAGE_MISSING)
    records = load_records(out / "requests.jsonl")
    assert all(r.completion_tokens == 48 and r.chunks.token_ids == [None] * len(r.chunks) for r in records)


def test_a_server_with_no_usage_at_all_is_told_apart() -> None:
    """The message without a final total keeps the old words (no "only at the end")."""
    record = RequestRecord(
        request_id="r", variant="v", endpoint=Endpoint.COMPLETIONS, url="u", model="m", params=RequestParams()
    )
    for t_ms, text in ((10.0, "a"), (20.0, "b")):
        record.chunks.t_ms.append(t_ms)
        record.chunks.completion_tokens.append(None)
        record.chunks.text_len.append(len(text))
        record.chunks.has_choice.append(True)
        record.chunks.token_ids.append(None)
    finding = usage_missing_finding(record, request_metrics(record))
    assert finding is not None and finding.message.startswith("The server sent no per-chunk usage;")
    assert finding.evidence["usage_at_end_only"] is False


def test_identity_comes_from_sglang_info_endpoints() -> None:
    """No /version: /server_info's version, as "sglang …"; a vLLM-dialect simulator keeps /version; a
    server with neither still raises /version's 404 (~1 s)."""

    async def model_path(url: str) -> str:
        async with SideClient() as client:
            return str((await client.get_json(f"{url}/get_model_info"))["model_path"])

    with sim_server(SimConfig(dialect="sglang")) as url:
        assert asyncio.run(_version(url)) == f"sglang {SIM_VERSION}"
        assert asyncio.run(model_path(url)) == "sim-tiny"
    with sim_server(SimConfig()) as url:
        assert asyncio.run(_version(url)) == SIM_VERSION
    assert server_build("sglang 0.5.14") == "SGLang 0.5.14"
    assert server_build(f"sglang {SIM_VERSION}").startswith("itlaudit simulator")
    record = environment_record("http://h", "sglang 0.5.14")
    assert record["server_version"] == "sglang 0.5.14" and record["vllm_version"] is None
    assert record["vllm_commit"] is None and record["simulated"] is False


async def _version(url: str) -> str | None:
    async with SideClient() as client:
        return await client.version(url)


def test_a_server_with_neither_version_nor_info_keeps_the_404() -> None:
    with app_on_thread(web.Application()) as url, pytest.raises(ServerStatusError) as caught:
        asyncio.run(_version(url))
    assert caught.value.status == 404 and "/version" in str(caught.value)


def test_generate_body_uses_sglangs_sampling_names() -> None:
    params = RequestParams(max_tokens=64, min_tokens=8, ignore_eos=True, temperature=0.0, seed=7)
    assert build_body(Endpoint.GENERATE, "ignored", "Hi", params) == {
        "text": "Hi",
        "sampling_params": {
            "max_new_tokens": 64,
            "min_new_tokens": 8,
            "ignore_eos": True,
            "temperature": 0.0,
            "sampling_seed": 7,
        },
        "stream": True,
    }
    assert build_body(Endpoint.GENERATE, "m", [5, 6], RequestParams(), {"return_logprob": True}) == {
        "input_ids": [5, 6],
        "sampling_params": {},
        "stream": True,
        "return_logprob": True,
    }


def _native(
    text: str, tokens: int | None, finish: object = None, ids: list[int] | None = None, **meta: object
) -> bytes:
    """A /generate event; its output_ids, unless given, the cumulative list SGLang sends by default."""
    info = {"id": "r1", "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": tokens, **meta}
    sent = list(range(100, 100 + (tokens or 0))) if ids is None else ids
    return json.dumps({"text": text, "output_ids": sent, "meta_info": info}).encode()


def test_generate_decoder_reads_cumulative_and_incremental_text() -> None:
    """Cumulative text and ids give each chunk's new piece and new ids; the matched stop and spec_* are
    kept. A text that does not extend the one before is a piece from then on."""
    decoder = GenerateDecoder()
    pieces = [decoder.decode(_native(t, n)).choices for t, n in (("Hel", 1), ("Hello", 2), ("Hello wo", 4))]
    assert [c[0].text for c in pieces if c] == ["Hel", "lo", " wo"]
    assert [c[0].token_ids for c in pieces if c] == [[100], [101], [102, 103]]
    last = decoder.decode(_native("Hello world", 5, {"type": "stop", "matched": 2}, spec_verify_ct=3))
    assert last.choices and last.choices[0].text == "rld" and last.choices[0].finish_reason == "stop"
    assert last.choices[0].token_ids == [104]
    assert last.choices[0].stop_reason == 2 and last.usage is not None and last.usage.completion_tokens == 5
    assert last.metrics is not None and last.metrics.speculative_decoding == {"spec_verify_ct": 3}
    incremental = GenerateDecoder()
    texts = [
        incremental.decode(_native(t, n, ids=[])).choices for t, n in (("Hel", 1), ("lo", 2), (" wo", 3))
    ]
    assert [c[0].text for c in texts if c] == ["Hel", "lo", " wo"]
    null = GenerateDecoder().decode(b'{"output_ids": null, "meta_info": {"completion_tokens": 1}}').choices
    assert null and null[0].token_ids is None


@pytest.mark.parametrize(
    ("events", "kept", "texts"),
    [
        # --incremental-streaming-output: each chunk's own ids, pieces queued behind the reader joined;
        # they add up to completion_tokens, which tells the mode at once, even for a repeated token
        # whose text ("a" after "a") would read as cumulative
        ([("a", [7], 1), ("a", [7], 2), ("bc", [8, 9], 4)], [[7], [7], [8, 9]], ["a", "a", "bc"]),
        # cumulative, a running request's list grown past its count while it was sent (by reference)
        (
            [("a", [7], 1), ("ab", [7, 8, 9], 2), ("abc", [7, 8, 9, 5], 4)],
            [[7], [8, 9], [5]],
            ["a", "b", "c"],
        ),
        # no completion_tokens: the ids cannot be placed, none kept (the record compares by text)
        ([("a", [7], None), ("ab", [7, 8], None)], [None, None], ["a", "b"]),
    ],
)
def test_generate_decoder_keeps_each_chunks_new_token_ids(
    events: list[tuple[str, list[int], int | None]], kept: list[list[int] | None], texts: list[str]
) -> None:
    decoder = GenerateDecoder()
    chunks = [decoder.decode(_native(text, count, ids=ids)).choices for text, ids, count in events]
    assert [c[0].token_ids for c in chunks if c] == kept
    assert [c[0].text for c in chunks if c] == texts


async def test_the_simulator_streams_pieces_as_sglang_does() -> None:
    """`--sglang-incremental-output` (~0.2 s): each /generate event carries its own text and ids, and
    meta_info's output logprobs only for them, while completion_tokens still counts all so far."""
    config = SimConfig(dialect="sglang", ttft_ms=0, step_ms=0, sglang_incremental_output=True)
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": 5}, "stream": True, "return_logprob": True}
    async with run_sim(config) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/generate", json=body) as response:
            raw = await response.read()
        info = await (await session.get(f"{url}/server_info")).json()
    events = [json.loads(p) for p in SSEFramer().feed(raw) if p != b"[DONE]"]
    assert [len(e["output_ids"]) for e in events] == [1] * 5 and info["incremental_streaming_output"]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 5]
    assert all(
        [entry[1] for entry in e["meta_info"]["output_token_logprobs"]] == e["output_ids"] for e in events
    )


def test_generate_decoder_turns_an_abort_and_an_error_into_error_frames() -> None:
    decoder = GenerateDecoder()
    abort = decoder.decode(_native("x", 1, {"type": "abort", "message": "out of memory"}))
    assert abort.error == {"message": "SGLang aborted the request: out of memory"}
    assert decoder.decode(b'{"error": {"message": "bad"}}').error == {"message": "bad"}


def test_sglang_per_request_counts_under_either_spelling() -> None:
    def record(block: JSONObject) -> RequestRecord:
        made = RequestRecord(
            request_id="r",
            variant="v",
            endpoint=Endpoint.GENERATE,
            url="u",
            model="m",
            params=RequestParams(),
        )
        made.spec_decode = block
        return made

    older: JSONObject = {"spec_verify_ct": 10, "spec_accept_token_num": 12, "spec_draft_token_num": 30}
    newer: JSONObject = {"spec_verify_ct": 10, "spec_accepted_drafts": 12, "spec_proposed_drafts": 30}
    expected = {"steps": 10, "accepted": 12, "drafted": 30, "k": 3}
    assert server_acceptance(record(older)) == expected == server_acceptance(record(newer))
    assert server_acceptance(record({"spec_verify_ct": 10, "spec_accept_length": 2.2})) is None


SGLANG_PAGE = """# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.25
sglang:token_usage{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.35
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 7
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 2
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 2.5
"""


def test_sglang_families_map_beside_vllms() -> None:
    """Ranks are identity labels; token_usage is a share, averaged over ranks, read as KV usage."""
    row = {"t_ns": 1, **delta_row(parse_scrape(SGLANG_PAGE), None)}
    figures = summarize_series([row])
    assert figures["kv_usage_max"] == pytest.approx(0.30)
    assert figures["running_max"] == 7 and figures["waiting_max"] == 2
    assert figures["gauge_acceptance_length_p50"] == 2.5 and figures["gen_throughput_p50"] is None
    assert figures["preemptions"] is None and figures["queue_time_mean_s"] is None


def test_vllm_pages_keep_their_figures_and_leave_sglangs_none() -> None:
    page = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    figures = summarize_series([{"t_ns": 1, **delta_row(parse_scrape(page), None)}])
    assert figures["kv_usage_max"] == 0.5 and figures["gauge_acceptance_length_p50"] is None
