"""The simulator is the auditor's fault-injection target, so each test pins one behaviour the auditor relies
on: tokens per chunk under speculative decoding, usage accounting, stop handling, each fault, and the wire
format of real vLLM captures."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from itlaudit.serve.sim import SIM_VERSION, SimConfig, run_sim

FIXTURES = Path(__file__).parent / "fixtures"
V032 = FIXTURES / "vllm-0.32.0-cpu"
FAST = {"step_ms": 0.2, "ttft_ms": 0.5}
USAGE = {"include_usage": True, "continuous_usage_stats": True}
DONE = "[DONE]"


def sim(**overrides: Any) -> SimConfig:
    return SimConfig(**{**FAST, **overrides})


def parse_frames(raw: bytes) -> list[Any]:
    """Split on blank lines; JSON payloads decoded, the [DONE] sentinel kept as a string."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    frames = raw[:-2].split(b"\n\n")
    assert all(f.startswith(b"data: ") for f in frames), frames
    return [f[6:].decode() if f == b"data: [DONE]" else json.loads(f[6:]) for f in frames]


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as resp:
        return resp.status, await resp.read()


async def stream(url: str, body: dict[str, Any], path: str = "/v1/completions") -> list[Any]:
    status, raw = await post(url, path, {"stream": True, **body})
    assert status == 200, raw
    return parse_frames(raw)


def token_chunks(frames: list[Any]) -> list[dict[str, Any]]:
    """Chunks that carry a choice with generated tokens (not the chat role chunk, not the usage chunk)."""
    return [
        f
        for f in frames
        if isinstance(f, dict) and f.get("choices") and "role" not in f["choices"][0].get("delta", {})
    ]


def ids(frames: list[Any]) -> list[int]:
    return [t for chunk in token_chunks(frames) for t in chunk["choices"][0]["token_ids"]]


def completion_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-tiny",
        "prompt": "The quick brown fox",
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "stream_options": USAGE,
        **extra,
    }


async def test_k0_one_token_per_chunk() -> None:
    async with run_sim(sim()) as url:
        frames = await stream(url, completion_body(8, ignore_eos=True))
    chunks = token_chunks(frames)
    assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [1] * 8
    assert [c["usage"]["completion_tokens"] for c in chunks] == list(range(1, 9))
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 7 + ["length"]
    usage_chunk = frames[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 4, "total_tokens": 12, "completion_tokens": 8}
    assert frames[-1] == DONE
    assert len(frames) == 10


async def test_k3_full_acceptance_four_tokens_per_decode_chunk() -> None:
    async with run_sim(sim(num_speculative_tokens=3, acceptance_prob=1.0)) as url:
        frames = await stream(url, completion_body(17))
    chunks = token_chunks(frames)
    # Prefill samples one token; each decode step accepts all 3 drafts plus the bonus token.
    assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [1, 4, 4, 4, 4]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 5, 9, 13, 17]
    assert [c["usage"]["total_tokens"] for c in chunks] == [5, 9, 13, 17, 21]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_greedy_tokens_do_not_depend_on_speculation() -> None:
    """At temperature 0 speculative decoding changes chunking, never the tokens — as with a real model."""
    async with run_sim(sim()) as url0, run_sim(sim(num_speculative_tokens=3, acceptance_prob=0.6)) as url3:
        k0 = await stream(url0, completion_body(40, ignore_eos=True))
        k3 = await stream(url3, completion_body(40, ignore_eos=True))
    assert ids(k0) == ids(k3)
    assert len(token_chunks(k3)) < len(token_chunks(k0)) == 40


def parse_metrics(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def test_partial_acceptance_metrics_match_stream() -> None:
    k, max_tokens = 3, 200
    async with run_sim(sim(num_speculative_tokens=k, acceptance_prob=0.5)) as url:
        runs = [await stream(url, completion_body(max_tokens, ignore_eos=True, seed=s)) for s in range(3)]
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
            metrics = parse_metrics(await resp.text())

    labels = '{engine="0",model_name="sim-tiny"}'
    per_pos_name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    per_pos = [
        metrics[f'{per_pos_name}{{engine="0",model_name="sim-tiny",position="{p}"}}'] for p in range(k)
    ]
    assert per_pos[0] > per_pos[1] > per_pos[2] > 0  # rejection sampling: acceptance falls off by position

    drafts = exact_accepted = final_accepted = 0
    for frames in runs:
        steps = [len(c["choices"][0]["token_ids"]) for c in token_chunks(frames)]
        assert sum(steps) == max_tokens
        drafts += len(steps) - 1  # every decode step verifies K drafts; prefill proposes none
        exact_accepted += sum(n - 1 for n in steps[1:-1])
        final_accepted += steps[-1] - 1  # the last step may have accepted more before the max_tokens cut
    assert metrics[f"vllm:spec_decode_num_drafts_total{labels}"] == drafts
    assert metrics[f"vllm:spec_decode_num_draft_tokens_total{labels}"] == k * drafts
    accepted = metrics[f"vllm:spec_decode_num_accepted_tokens_total{labels}"]
    assert accepted == sum(per_pos)
    assert exact_accepted + final_accepted <= accepted <= exact_accepted + k * len(runs)
    assert metrics[f"vllm:generation_tokens_total{labels}"] == 3 * max_tokens
    success = '{engine="0",finished_reason="length",model_name="sim-tiny"}'
    assert metrics[f"vllm:request_success_total{success}"] == 3


async def test_metrics_without_speculation_have_no_spec_decode_counters() -> None:
    async with (
        run_sim(sim()) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/metrics") as resp,
    ):
        text = await resp.text()
    assert "vllm:generation_tokens_total" in text
    assert "spec_decode" not in text


async def test_cap_fault_truncates_with_length() -> None:
    async with run_sim(sim(cap_tokens=128)) as url:
        frames = await stream(url, completion_body(300, ignore_eos=True))
    chunks = token_chunks(frames)
    assert len(ids(frames)) == 128
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert frames[-2]["usage"]["completion_tokens"] == 128


async def test_drop_usage_fault_removes_usage_everywhere() -> None:
    async with run_sim(sim(drop_usage=True)) as url:
        frames = await stream(url, completion_body(6))
    chunks = [f for f in frames if f != DONE]
    assert len(chunks) == 6  # no trailing usage-only chunk either
    assert all("usage" not in c for c in chunks)
    # With no usage chunk to follow, vLLM stamps the fingerprint on the terminal chunk.
    assert "system_fingerprint" in chunks[-1]
    assert frames[-1] == DONE


async def test_error_fault_sends_vllm_error_frame_then_done() -> None:
    async with run_sim(sim(error_after_tokens=5)) as url:
        status, raw = await post(url, "/v1/completions", {"stream": True, **completion_body(50)})
    assert status == 200
    frames = raw.split(b"\n\n")
    assert frames[-3:] == [
        b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root '
        b'cause.", "type": "InternalServerError", "param": null, "code": 500}}',
        b"data: [DONE]",
        b"",
    ]
    assert len(ids(parse_frames(raw)[:-2])) == 5


async def test_reset_fault_breaks_the_connection() -> None:
    body = {"stream": True, **completion_body(50)}
    async with (
        run_sim(sim(reset_after_tokens=3)) as url,
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_no_done_fault_omits_done() -> None:
    async with run_sim(sim(no_done=True)) as url:
        frames = await stream(url, completion_body(4))
    assert DONE not in frames
    assert frames[-1]["choices"] == []
    assert frames[-1]["usage"]["completion_tokens"] == 4


async def test_stop_token_ids_honoured_and_ignored_under_fault() -> None:
    async with run_sim(sim()) as url, run_sim(sim(ignore_stop_token_ids=True)) as faulty:
        reference = await stream(url, completion_body(30, ignore_eos=True))
        ref_ids = ids(reference)
        stop_id = ref_ids[6]
        cut = ref_ids.index(stop_id)
        stopped = await stream(url, completion_body(30, ignore_eos=True, stop_token_ids=[stop_id]))
        ignored = await stream(faulty, completion_body(30, ignore_eos=True, stop_token_ids=[stop_id]))

    last = token_chunks(stopped)[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop_id)
    # As in vLLM the stop token is counted and returned in token_ids, but its text is not emitted.
    assert ids(stopped) == ref_ids[: cut + 1]
    assert last["text"] == ""
    text = "".join(c["choices"][0]["text"] for c in token_chunks(stopped))
    assert text == "".join(c["choices"][0]["text"] for c in token_chunks(reference)[:cut])
    assert stopped[-2]["usage"]["completion_tokens"] == cut + 1

    assert ids(ignored) == ref_ids
    assert token_chunks(ignored)[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("overrides", "body", "expected"),
    [
        ({}, {}, (6, "stop")),
        ({}, {"ignore_eos": True}, (20, "length")),
        ({"ignore_ignore_eos": True}, {"ignore_eos": True}, (6, "stop")),
        ({}, {"min_tokens": 10}, (20, "length")),
        ({"ignore_min_tokens": True}, {"min_tokens": 10}, (6, "stop")),
    ],
    ids=["eos", "ignore_eos", "ignore_ignore_eos-fault", "min_tokens", "ignore_min_tokens-fault"],
)
async def test_natural_eos_with_ignore_eos_and_min_tokens(
    overrides: dict[str, Any], body: dict[str, Any], expected: tuple[int, str]
) -> None:
    async with run_sim(sim(natural_eos_at=5, **overrides)) as url:
        frames = await stream(url, completion_body(20, **body))
    last = token_chunks(frames)[-1]["choices"][0]
    assert (len(ids(frames)), last["finish_reason"]) == expected
    assert last["stop_reason"] is None
    if expected[1] == "stop":
        assert ids(frames)[-1] == 2  # the EOS token id is returned, as vLLM does


async def test_chat_role_chunk_and_prompt_fields() -> None:
    messages = [{"role": "user", "content": "hello"}]
    async with run_sim(sim()) as url:
        plain = await stream(
            url, {"messages": messages, "max_tokens": 3, "stream_options": USAGE}, "/v1/chat/completions"
        )
        rich = await stream(
            url,
            {"messages": messages, "max_tokens": 3, "return_token_ids": True, "return_prompt_text": True},
            "/v1/chat/completions",
        )
    role = plain[0]
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert role["usage"]["completion_tokens"] == 0
    assert (role["prompt_token_ids"], role["prompt_text"]) == (None, None)
    assert all(c["choices"][0]["token_ids"] is None for c in token_chunks(plain))
    assert len({f["id"] for f in plain if f != DONE}) == 1

    assert "usage" not in rich[0]
    assert rich[0]["prompt_text"] == "<|user|>\nhello<|end|>\n<|assistant|>\n"
    assert len(rich[0]["prompt_token_ids"]) == 3
    assert len(ids(rich)) == 3
    assert rich[-1] == DONE and "system_fingerprint" in rich[-2]


async def test_non_streaming_matches_stream() -> None:
    async with run_sim(sim(num_speculative_tokens=2)) as url:
        frames = await stream(url, completion_body(12))
        status, raw = await post(url, "/v1/completions", completion_body(12))
    body = json.loads(raw)
    assert status == 200
    choice = body["choices"][0]
    assert choice["token_ids"] == ids(frames)
    assert choice["text"] == "".join(c["choices"][0]["text"] for c in token_chunks(frames))
    assert body["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 16,
        "completion_tokens": 12,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]


# --- wire format against real vLLM captures -------------------------------------------------------------


def shape(value: Any) -> Any:
    """Key order and value types, recursively; values themselves (ids, text, timestamps) are ignored."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *sorted({repr(shape(v)) for v in value})]
    return type(value).__name__


def kind(chunk: Any, first: bool) -> str:
    if chunk == DONE:
        return "done"
    if "error" in chunk:
        return "error"
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if "role" in choice.get("delta", {}):
        return "role"
    if choice["finish_reason"] is not None:
        return "terminal"
    return "first" if first else "token"


def shapes_by_kind(frames: list[Any]) -> dict[str, Any]:
    kinds: dict[str, Any] = {}
    seen_token = False
    for chunk in frames:
        k = kind(chunk, not seen_token)
        seen_token = seen_token or k in {"first", "terminal", "token"}
        kinds.setdefault(k, shape(chunk))
        assert kinds[k] == shape(chunk), f"inconsistent {k} chunks"
    return kinds


def kind_sequence(frames: list[Any]) -> str:
    """Compresses repeated middle chunks so streams of different lengths compare equal."""
    seen_token, out = False, []
    for chunk in frames:
        k = kind(chunk, not seen_token)
        seen_token = seen_token or k in {"first", "terminal", "token"}
        out.append(k)
    return re.sub(r"(token )+", "token* ", " ".join(out) + " ")


CAPTURES = sorted(FIXTURES.glob("vllm-*/*.sse"))
PROMPTS = {
    "/v1/completions": {"prompt": "The quick brown fox"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello there"}]},
}


def without_completion_tokens_details(frames: list[Any]) -> list[Any]:
    """vLLM 0.24 did not pass completion_tokens_details to chat UsageInfo, so its chunks lack the key that
    0.32 (the simulator's target) serialises as null; the one known 0.24/0.32 structural difference."""
    for frame in frames:
        if isinstance(frame, dict):
            frame.get("usage", {}).pop("completion_tokens_details", None)
    return frames


async def first_occurrence_at_or_after(url: str, endpoint: str, body: dict[str, Any], position: int) -> int:
    """A token id the greedy stream first emits at index >= position, to stop a stream at a chosen length."""
    reference = ids(await stream(url, {**body, "max_tokens": position + 40}, endpoint))
    return next(t for i, t in enumerate(reference) if i >= position and reference.index(t) == i)


@pytest.mark.parametrize("capture", CAPTURES, ids=[f"{p.parent.name}/{p.name}" for p in CAPTURES])
async def test_wire_format_matches_capture(capture: Path) -> None:
    """Replays each real capture's request shape against the simulator and compares chunk structure:
    key names and order and value types per chunk kind, and the order of chunk kinds."""
    raw = capture.read_bytes()
    real = parse_frames(raw)
    chat = real[0].get("object") == "chat.completion.chunk"
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    chunks = token_chunks(real)
    produced = chunks[-1]["usage"]["completion_tokens"]
    errored = "error" in real[-2]
    stop_reason = chunks[-1]["choices"][0].get("stop_reason")
    body = {
        **PROMPTS[endpoint],
        "max_tokens": produced + 10 if errored else produced,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": USAGE,
        "return_token_ids": chunks[0]["choices"][0]["token_ids"] is not None,
    }
    config = sim(
        model=real[0]["model"],
        num_speculative_tokens=3 if "-k3" in capture.name else 0,
        error_after_tokens=produced if errored else None,
    )
    async with run_sim(config) as url:
        if stop_reason is not None:
            body["stop_token_ids"] = [await first_occurrence_at_or_after(url, endpoint, body, produced - 1)]
        status, sim_raw = await post(url, endpoint, {"stream": True, **body})
    assert status == 200
    simulated = parse_frames(sim_raw)
    if capture.parent.name.startswith("vllm-0.24"):
        simulated = without_completion_tokens_details(simulated)

    assert shapes_by_kind(simulated) == shapes_by_kind(real)
    assert kind_sequence(simulated) == kind_sequence(real)
    # Chunks serialise compactly with raw UTF-8 (pydantic), so re-dumping reproduces the bytes exactly;
    # the error frame is the exception, with json.dumps' default separators.
    for stream_raw in (raw, sim_raw):
        for frame, parsed in zip(stream_raw.split(b"\n\n"), parse_frames(stream_raw), strict=False):
            if isinstance(parsed, dict):
                separators = (", ", ": ") if "error" in parsed else (",", ":")
                compact = json.dumps(parsed, ensure_ascii=not separators[1].strip(), separators=separators)
                assert frame == b"data: " + compact.encode()
    if errored:
        assert sim_raw.split(b"\n\n")[-3:] == raw.split(b"\n\n")[-3:]


def captured_content_type(name: str) -> str:
    headers = (V032 / f"{name}.headers").read_text().splitlines()
    return next(h.split(": ", 1)[1] for h in headers if h.lower().startswith("content-type:"))


async def test_plain_endpoints_match_captures() -> None:
    async with run_sim(sim(model="tiny")) as url, aiohttp.ClientSession() as session:
        prompt = {"model": "tiny", "prompt": "The quick brown fox"}
        for name, method, path, body in [
            ("error-max-tokens-too-large.json", "POST", "/v1/completions", {**prompt, "max_tokens": 4096}),
            ("error-unknown-model.json", "POST", "/v1/completions", {**prompt, "model": "nope"}),
        ]:
            async with session.request(method, url + path, json=body) as resp:
                assert await resp.read() == (V032 / name).read_bytes(), name
                status_line = (V032 / f"{name}.headers").read_text().split()[1]
                assert resp.status == int(status_line)
                assert resp.headers["Content-Type"] == captured_content_type(name)
        # vLLM's /version layout, with the simulator's name where vLLM's version stands.
        async with session.get(url + "/version") as resp:
            captured = (V032 / "version.json").read_bytes()
            assert await resp.read() == captured.replace(b'"0.32.0"', json.dumps(SIM_VERSION).encode())
            assert resp.headers["Content-Type"] == captured_content_type("version.json")
        async with session.get(url + "/v1/models") as resp:
            models = await resp.json()
            assert shape(models) == shape(json.loads((V032 / "models.json").read_bytes()))
            assert models["data"][0]["owned_by"] == "itlaudit-sim"  # vLLM says "vllm"
            assert resp.headers["Content-Type"] == captured_content_type("models.json")
        async with session.get(url + "/metrics") as resp:
            assert resp.headers["Content-Type"] == captured_content_type("metrics-k0.txt")
        async with session.post(url + "/v1/completions", json={**prompt, "stream": True}) as resp:
            assert resp.headers["Content-Type"] == captured_content_type("completions-k0-token-ids.sse")
        async with session.get(url + "/health") as resp:
            assert (resp.status, await resp.read()) == (200, b"")


async def test_spec_decode_metrics_reproduce_k3_capture() -> None:
    """The K3 capture's request sequence yields the same counters on the simulator: acceptance counts are
    taken before a step is cut at max_tokens or at a stop token, exactly as vLLM's scheduler does."""
    body = {"model": "tiny", "temperature": 0, "stream_options": USAGE, "return_token_ids": True}
    completions = {**body, **PROMPTS["/v1/completions"], "max_tokens": 16}
    chat = {**body, **PROMPTS["/v1/chat/completions"], "max_tokens": 16}
    omitted = {k: v for k, v in completions.items() if k != "max_tokens"}
    config = sim(model="tiny", num_speculative_tokens=3, acceptance_prob=1.0, default_max_tokens=128)
    async with run_sim(sim(model="tiny")) as probe:
        stop_id = await first_occurrence_at_or_after(probe, "/v1/completions", completions, 4)
    async with run_sim(config) as url:
        shapes = [
            [len(c["choices"][0]["token_ids"]) for c in token_chunks(await stream(url, b, path))]
            for path, b in [
                ("/v1/completions", completions),
                ("/v1/chat/completions", chat),
                ("/v1/completions", omitted),
                ("/v1/completions", {**completions, "max_tokens": 64, "stop_token_ids": [stop_id]}),
            ]
        ]
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
            simulated = parse_metrics(await resp.text())
    assert shapes == [[1, 4, 4, 4, 3], [1, 4, 4, 4, 3], [1, 4, 4, 4, 3], [1, 4]]  # as in the README table
    real = parse_metrics((V032 / "metrics-k3.txt").read_text())
    compared = [n for n in real if n.startswith(("vllm:spec_decode", "vllm:generation_tokens_total"))]
    compared = [n for n in compared if "_created" not in n]
    assert len(compared) == 7
    assert {n: simulated[n] for n in compared} == {n: real[n] for n in compared}


@pytest.mark.parametrize(
    ("endpoint", "max_tokens", "default_max_tokens", "expected"),
    [
        ("/v1/completions", None, 128, 16),  # completions-k3-max-tokens-omitted: CompletionRequest default
        ("/v1/chat/completions", None, None, 64 - 4),  # chat-k0-...-no-override: max_model_len - prompt
        ("/v1/chat/completions", None, 28, 28),  # chat-k3-max-tokens-omitted: generation-config cap
        ("/v1/completions", 50, 28, 28),  # completions-k3-max-tokens-2000-capped-by-override
    ],
)
async def test_max_tokens_defaults_follow_vllm(
    endpoint: str, max_tokens: int | None, default_max_tokens: int | None, expected: int
) -> None:
    body = {**PROMPTS[endpoint], "ignore_eos": True, "stream_options": USAGE}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    async with run_sim(sim(max_model_len=64, default_max_tokens=default_max_tokens)) as url:
        frames = await stream(url, body, endpoint)
    assert frames[-2]["usage"]["prompt_tokens"] == 4  # the simulator's word-level tokenizer
    assert frames[-2]["usage"]["completion_tokens"] == expected
    assert token_chunks(frames)[-1]["choices"][0]["finish_reason"] == "length"


def spec_decode_series(metrics_text: str) -> set[str]:
    """Sample names with their label sets, values dropped: what a scraper keys on."""
    return {line.split(" ")[0] for line in metrics_text.splitlines() if line.startswith("vllm:spec_decode")}


@pytest.mark.parametrize("capture", ["vllm-0.24.0-cuda/metrics-k3.txt", "vllm-0.32.0-cpu/metrics-k3.txt"])
async def test_spec_decode_metric_names_and_labels_match_capture(capture: str) -> None:
    async with (
        run_sim(sim(model="tiny", num_speculative_tokens=3)) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/metrics") as resp,
    ):
        simulated = spec_decode_series(await resp.text())
    real = spec_decode_series((FIXTURES / capture).read_text())
    assert len(real) == 12  # 3 counters + 3 per-position series, each with _total and _created
    assert simulated == real


async def test_split_utf8_characters_give_empty_text_chunks() -> None:
    """Byte-level pieces split multi-byte characters: the first half yields a chunk with a token but no
    text, the second half completes the character, as in real streams."""
    async with run_sim(sim(step_ms=0)) as url:
        frames = await stream(url, completion_body(2000, ignore_eos=True))
    texts = [c["choices"][0]["text"] for c in token_chunks(frames)]
    assert len(texts) == 2000
    assert "" in texts
    assert "€" in "".join(texts) or "🙂" in "".join(texts)


async def test_chunks_are_flushed_per_engine_step() -> None:
    """ITL is measured from arrival times, so each step's chunk must reach the client when it is made."""
    loop = asyncio.get_running_loop()
    async with (
        run_sim(sim(step_ms=25, ttft_ms=60)) as url,
        aiohttp.ClientSession() as session,
    ):
        start = loop.time()
        async with session.post(url + "/v1/completions", json={"stream": True, **completion_body(5)}) as resp:
            arrivals = [loop.time() - start async for line in resp.content if line.startswith(b"data: {")]
    token_arrivals = arrivals[:5]
    assert token_arrivals[0] >= 0.05
    gaps = [b - a for a, b in itertools.pairwise(token_arrivals)]
    assert len(gaps) == 4
    assert all(gap >= 0.02 for gap in gaps), gaps


async def test_server_survives_client_disconnect() -> None:
    async with run_sim(sim(step_ms=5)) as url, aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/completions", json={"stream": True, **completion_body(500)}
        ) as resp:
            await resp.content.readline()
        frames = await stream(url, completion_body(3))
    assert len(ids(frames)) == 3


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"stream_options": [True]}, "stream_options", "stream_options must be an object"),
        ({"temperature": [0]}, "temperature", "temperature must be a number"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids", "stop_token_ids must be a list of integers"),
        ({"stop_token_ids": 7}, "stop_token_ids", "stop_token_ids must be a list of integers"),
        ({"seed": "7"}, "seed", "seed must be an integer"),
    ],
)
async def test_a_body_field_of_the_wrong_json_type_is_a_400_naming_it(
    extra: dict[str, Any], param: str, message: str
) -> None:
    """The incoming body is JSON checked once (sim/validation.py): a field of the wrong type is vLLM's
    400 error body naming the parameter, never a 500 from a crash further in."""
    async with run_sim(sim()) as url:
        status, raw = await post(url, "/v1/completions", completion_body(2, **extra))
    assert status == 400
    assert json.loads(raw) == {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    }
