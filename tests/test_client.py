"""Streaming client against loopback servers that replay real vLLM 0.24.0 bytes.

The replay server writes each event in small pieces and sleeps between events, so the tests see what
a real network does to the byte stream (events split across reads) and can tell receipt-time stamps
from parse-time ones. Failure cases use a raw socket server where aiohttp.web would refuse to
misbehave (a half-sent chunked body, a stream that stalls).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from itlaudit.capture.client import StreamOptions, parse_retry_after, stream_request
from itlaudit.capture.request_plan import build_body, plan_request
from itlaudit.errors import ServerAnswerError, ServerStatusError, ServerUnreachableError
from itlaudit.model.records import (
    RequestParams,
    RequestRecord,
    Status,
    Timeouts,
)
from itlaudit.side.client import SideClient, server_error_message

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda"
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
EVENT_GAP_S = 0.02
WRITE_SIZE = 37  # small enough that every event arrives over several reads

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse_events(stream: bytes) -> list[bytes]:
    """A capture cut into its events, each keeping its terminating blank line."""
    return [block + b"\n\n" for block in stream.split(b"\n\n")[:-1]]


def expected_texts(stream: bytes, *, chat: bool) -> list[str]:
    """Per-chunk text straight from the capture's JSON (the usage-only last chunk has none)."""
    texts = []
    for event in sse_events(stream)[:-1]:
        choices = json.loads(event[len(b"data: ") :])["choices"]
        if not choices:
            texts.append("")
        elif chat:
            texts.append(choices[0]["delta"].get("content") or "")
        else:
            texts.append(choices[0]["text"] or "")
    return texts


@contextlib.asynccontextmanager
async def serve(routes: dict[tuple[str, str], Handler]) -> AsyncIterator[str]:
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def replay_handler(
    events: list[bytes], received_bodies: list[tuple[str, dict[str, Any]]], *, gap_s: float = EVENT_GAP_S
) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        received_bodies.append((request.path, await request.json()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for index, event in enumerate(events):
            if index:
                await asyncio.sleep(gap_s)
            for offset in range(0, len(event), WRITE_SIZE):
                await resp.write(event[offset : offset + WRITE_SIZE])
        await resp.write_eof()
        return resp

    return handler


def both_endpoints(handler: Handler) -> dict[tuple[str, str], Handler]:
    return {("POST", "/v1/completions"): handler, ("POST", "/v1/chat/completions"): handler}


async def run_request(
    base_url: str, endpoint: str, params: RequestParams | None = None, *, timeouts: Timeouts | None = None
) -> RequestRecord:
    plan = plan_request(
        base_url=base_url,
        endpoint=endpoint,
        model="tiny",
        prompt="Hello",
        params=params or RequestParams(max_tokens=16),
        request_id="r1",
        variant="k3",
    )
    return await stream_request(plan, StreamOptions(timeouts=timeouts or Timeouts()))


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- replaying real captures ----------------------------------------------------------------------

CAPTURE_EXPECTATIONS = {
    "completions-k0-token-ids.sse": {
        "endpoint": "completions",
        "response_id": "cmpl-a06b5da8c00a3b42",
        "prompt_tokens": 4,
        "tokens": [*range(1, 17), 16],
        "token_ids": [335, 132, 477, 183, 209, 178, 27, 201, 327, 309, 99, 449, 351, 367, 97, 229],
    },
    "completions-k3-token-ids.sse": {
        "endpoint": "completions",
        "response_id": "cmpl-93753dee33ca3036",
        "prompt_tokens": 4,
        "tokens": [*range(1, 17), 16],
        "token_ids": [280, 232, 21, 294, 260, 422, 296, 422, 57, 68, 133, 456, 243, 316, 342, 47],
    },
    # vLLM's chat stream skipped the chunk for token 15 here (its text was empty), so the finishing
    # chunk carries two tokens: exactly the case chunk counting gets wrong.
    "chat-k0.sse": {
        "endpoint": "chat",
        "response_id": "chatcmpl-bcbd20bf069b0b78",
        "prompt_tokens": 16,
        "tokens": [*range(0, 15), 16, 16],
        "token_ids": None,
    },
    "chat-k3.sse": {
        "endpoint": "chat",
        "response_id": "chatcmpl-bb9527625dcdc506",
        "prompt_tokens": 16,
        "tokens": [*range(0, 17), 16],
        "token_ids": None,
    },
}


@pytest.mark.parametrize("capture_name", sorted(CAPTURE_EXPECTATIONS))
async def test_replayed_capture_gives_exact_record(capture_name: str) -> None:
    expected = CAPTURE_EXPECTATIONS[capture_name]
    endpoint = expected["endpoint"]
    stream = (FIXTURES / capture_name).read_bytes()
    received_bodies: list[tuple[str, dict[str, Any]]] = []
    wall_before = time.time()
    async with serve(both_endpoints(replay_handler(sse_events(stream), received_bodies))) as base_url:
        record = await run_request(base_url, endpoint)

    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    assert received_bodies == [(path, build_body(endpoint, "tiny", "Hello", RequestParams(max_tokens=16)))]
    assert record.url == base_url + path
    assert (record.request_id, record.variant, record.endpoint, record.model) == (
        "r1",
        "k3",
        endpoint,
        "tiny",
    )
    assert record.status == Status.OK
    assert record.error is None
    assert record.http_status == 200
    assert record.done_sentinel is True
    assert record.response_id == expected["response_id"]
    assert record.system_fingerprint == "vllm-0.24.0-nohash"
    assert record.finish_reason == "length"
    assert record.stop_reason is None
    assert record.prompt_tokens == expected["prompt_tokens"]
    assert record.completion_tokens == 16

    chunks = record.chunks
    n_chunks = len(expected["tokens"])
    assert len(chunks) == n_chunks
    assert chunks.completion_tokens == expected["tokens"]
    assert chunks.has_choice == [True] * (n_chunks - 1) + [False]
    if expected["token_ids"] is None:
        assert chunks.token_ids == [None] * n_chunks
    else:
        assert chunks.token_ids == [[token_id] for token_id in expected["token_ids"]] + [None]
    texts = expected_texts(stream, chat=endpoint == "chat")
    assert record.text == "".join(texts)
    assert chunks.text_len == [len(t) for t in texts]
    assert 0 in chunks.text_len[:-1]  # chunks with no text still count through usage

    # Receipt-time stamping: each event was sent EVENT_GAP_S after the previous one.
    gaps = [b - a for a, b in itertools.pairwise(chunks.t_ms)]
    assert chunks.t_ms[0] > 0
    assert min(gaps) >= EVENT_GAP_S * 1000 / 2, gaps
    assert record.e2e_ms >= chunks.t_ms[-1] + EVENT_GAP_S * 1000 / 2  # [DONE] came one gap later
    assert record.stamp in ("kernel", "loop")
    assert wall_before <= record.started_at_unix <= time.time()


async def test_chat_role_chunk_counts_zero_tokens_and_no_text() -> None:
    stream = (FIXTURES / "chat-k0.sse").read_bytes()
    async with serve(both_endpoints(replay_handler(sse_events(stream), [], gap_s=0))) as base_url:
        record = await run_request(base_url, "chat")
    assert (record.chunks.completion_tokens[0], record.chunks.text_len[0]) == (0, 0)
    assert record.chunks.has_choice[0] is True


async def test_events_arriving_in_one_read_share_its_receipt_time() -> None:
    events = sse_events((FIXTURES / "completions-k3-token-ids.sse").read_bytes())
    bursts = [b"".join(events[:3]), b"".join(events[3:])]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(bursts[0])
        await asyncio.sleep(0.05)
        await resp.write(bursts[1])
        await resp.write_eof()
        return resp

    async with serve(both_endpoints(handler)) as base_url:
        record = await run_request(base_url, "completions")
    t_ms = record.chunks.t_ms
    assert len(t_ms) == 17
    assert t_ms[0] == t_ms[1] == t_ms[2]
    assert len(set(t_ms[3:])) == 1
    assert t_ms[3] - t_ms[2] >= 25
    assert record.done_sentinel is True


# --- failures are recorded, not raised ------------------------------------------------------------

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


async def test_error_frame_mid_stream_is_a_stream_error_and_reading_continues() -> None:
    events = sse_events((FIXTURES / "completions-k0-token-ids.sse").read_bytes())
    error_frame = {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "code": 500}}
    replay = [*events[:2], f"data: {json.dumps(error_frame)}\n\n".encode(), b"data: [DONE]\n\n"]
    async with serve(both_endpoints(replay_handler(replay, [], gap_s=0))) as base_url:
        record = await run_request(base_url, "completions")
    assert record.status == Status.STREAM_ERROR
    assert record.error == ENGINE_DEAD
    assert record.done_sentinel is True
    assert record.chunks.completion_tokens == [1, 2]
    assert record.chunks.token_ids == [[335], [132]]
    assert record.completion_tokens == 2
    assert record.finish_reason is None


async def test_non_json_data_event_is_a_stream_error() -> None:
    replay = [b"data: not json\n\n", b"data: [DONE]\n\n"]
    async with serve(both_endpoints(replay_handler(replay, [], gap_s=0))) as base_url:
        record = await run_request(base_url, "completions")
    assert record.status == Status.STREAM_ERROR
    assert record.error == "server sent a data event that is not JSON: 'not json'"
    assert len(record.chunks) == 0
    assert record.done_sentinel is True


async def test_http_400_records_vllm_message() -> None:
    message = "This model's maximum context length is 2048 tokens. However, you requested 4096 tokens."

    async def handler(request: web.Request) -> web.Response:
        body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
        return web.json_response(body, status=400)

    async with serve(both_endpoints(handler)) as base_url:
        record = await run_request(base_url, "chat")
    assert record.status == Status.HTTP_ERROR
    assert record.http_status == 400
    assert record.error == message
    assert len(record.chunks) == 0
    assert record.done_sentinel is False
    assert record.e2e_ms is not None and record.e2e_ms > 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "new style", "type": "BadRequestError", "code": 400}}', "new style"),
        (b'{"object": "error", "message": "old style", "type": "BadRequestError", "code": 400}', "old style"),
        (b'{"message": "bare"}', "bare"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"x" * 1000, "x" * 300),
        (b"", "HTTP 502 with an empty body"),
    ],
)
def test_server_error_message_shapes(body: bytes, message: str) -> None:
    assert server_error_message(body, 502) == message


@contextlib.asynccontextmanager
async def raw_http_server(
    on_request: Callable[[asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A server that reads one request fully (so closing early is a clean FIN, not a reset of unread
    data) and then hands the socket to `on_request` to misbehave on."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        try:
            await on_request(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


SSE_RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_connection_closed_mid_stream_keeps_chunks_received_so_far() -> None:
    stream = (FIXTURES / "completions-k0-token-ids.sse").read_bytes()
    events = sse_events(stream)

    async def send_three_then_close(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_RESPONSE_HEAD + b"".join(http_chunk(e) for e in events[:3]))
        writer.write(http_chunk(events[3][:50]))  # an event cut off mid-way: must not be recorded
        await writer.drain()

    async with raw_http_server(send_three_then_close) as base_url:
        record = await run_request(base_url, "completions")
    assert record.status == Status.CONNECTION_ERROR
    assert record.error is not None and "\n" not in record.error
    assert record.http_status == 200
    assert record.chunks.completion_tokens == [1, 2, 3]
    assert record.chunks.token_ids == [[335], [132], [477]]
    assert record.text == "".join(expected_texts(stream, chat=False)[:3])
    assert record.done_sentinel is False
    assert record.e2e_ms == pytest.approx(record.chunks.t_ms[-1])


async def test_stalled_stream_is_cut_by_the_stall_timeout_with_chunks_kept() -> None:
    events = sse_events((FIXTURES / "chat-k3.sse").read_bytes())
    release = asyncio.Event()

    async def send_two_then_stall(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_RESPONSE_HEAD + http_chunk(events[0]) + http_chunk(events[1]))
        await writer.drain()
        await release.wait()

    async with raw_http_server(send_two_then_stall) as base_url:
        try:
            record = await run_request(base_url, "chat", timeouts=Timeouts(stall_timeout_s=0.3))
        finally:
            release.set()
    assert record.status == Status.TIMEOUT
    assert record.timeout_limit == "stall_timeout_s"
    assert record.error is not None and "\n" not in record.error
    assert "stall_timeout_s = 0.3 s" in record.error and "after 2 chunks" in record.error
    assert record.chunks.completion_tokens == [0, 1]
    assert record.text == "0"
    assert record.e2e_ms is not None and record.e2e_ms >= record.chunks.t_ms[-1] + 300  # real elapsed time


async def test_silence_after_the_head_is_cut_by_ttft_timeout() -> None:
    release = asyncio.Event()

    async def head_then_silence(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_RESPONSE_HEAD)
        await writer.drain()
        await release.wait()

    async with raw_http_server(head_then_silence) as base_url:
        try:
            timeouts = Timeouts(ttft_timeout_s=0.2, stall_timeout_s=30)
            record = await run_request(base_url, "chat", timeouts=timeouts)
        finally:
            release.set()
    assert (record.status, record.timeout_limit) == (Status.TIMEOUT, "ttft_timeout_s")
    assert record.http_status == 200 and len(record.chunks) == 0
    assert 200 <= record.e2e_ms < 5000


async def test_a_server_that_never_answers_is_cut_before_its_head() -> None:
    release = asyncio.Event()

    async def no_answer(writer: asyncio.StreamWriter) -> None:
        await release.wait()

    async with raw_http_server(no_answer) as base_url:
        try:
            record = await run_request(base_url, "chat", timeouts=Timeouts(stall_timeout_s=0.2))
        finally:
            release.set()
    assert (record.status, record.timeout_limit) == (Status.TIMEOUT, "stall_timeout_s")
    assert record.http_status is None and record.e2e_ms >= 200


async def test_request_timeout_bounds_a_stream_that_keeps_sending() -> None:
    events = sse_events((FIXTURES / "completions-k0-token-ids.sse").read_bytes())

    async def slow_but_steady(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_RESPONSE_HEAD)
        for event in events:
            writer.write(http_chunk(event))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with raw_http_server(slow_but_steady) as base_url:
        timeouts = Timeouts(stall_timeout_s=1.0, request_timeout_s=0.3)
        record = await run_request(base_url, "completions", timeouts=timeouts)
    assert (record.status, record.timeout_limit) == (Status.TIMEOUT, "request_timeout_s")
    assert 3 <= len(record.chunks) < len(events)
    assert record.e2e_ms == pytest.approx(300, abs=100)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("3", 3.0), (" 0 ", 0.0), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_retry_after_delay_seconds_or_http_date(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


async def test_connection_refused_is_recorded() -> None:
    record = await run_request(f"http://127.0.0.1:{unused_port()}", "completions")
    assert record.status == Status.CONNECTION_ERROR
    assert record.error is not None and "\n" not in record.error
    assert record.http_status is None
    assert len(record.chunks) == 0


# --- request bodies -------------------------------------------------------------------------------


def test_build_body_completions_leaves_out_unset_fields() -> None:
    assert build_body("completions", "tiny", "Hi", RequestParams()) == {
        "model": "tiny",
        "prompt": "Hi",
        "stream": True,
        "stream_options": STREAM_OPTIONS,
        "return_token_ids": True,
    }


def test_build_body_completions_with_limits() -> None:
    params = RequestParams(max_tokens=16, min_tokens=0, ignore_eos=False, stop_token_ids=[])
    assert build_body("completions", "tiny", "Hi", params) == {
        "model": "tiny",
        "prompt": "Hi",
        "stream": True,
        "stream_options": STREAM_OPTIONS,
        "return_token_ids": True,
        "max_tokens": 16,
        "min_tokens": 0,
    }


def test_build_body_chat_with_every_param() -> None:
    params = RequestParams(
        max_tokens=512, min_tokens=8, ignore_eos=True, stop_token_ids=[2, 7], temperature=0.0, seed=1
    )
    assert build_body("chat", "tiny", "Hi", params) == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": STREAM_OPTIONS,
        "return_token_ids": True,
        "max_tokens": 512,
        "min_tokens": 8,
        "ignore_eos": True,
        "stop_token_ids": [2, 7],
        "temperature": 0.0,
        "seed": 1,
    }


def test_build_body_extra_body_merges_last() -> None:
    extra = {"temperature": 0.7, "stream_options": {"include_usage": True}, "top_k": 5}
    body = build_body("chat", "tiny", "Hi", RequestParams(temperature=0.0), extra)
    assert body["temperature"] == 0.7
    assert body["stream_options"] == {"include_usage": True}
    assert body["top_k"] == 5


def test_build_body_does_not_alias_params_lists() -> None:
    params = RequestParams(stop_token_ids=[2])
    build_body("completions", "tiny", "Hi", params)["stop_token_ids"].append(3)
    assert params.stop_token_ids == [2]


def test_build_body_rejects_unknown_endpoint() -> None:
    with pytest.raises(ValueError, match="unknown endpoint 'embeddings'"):
        build_body("embeddings", "tiny", "Hi", RequestParams())


# --- side requests (side/client.py) against hand-made answers ------------------------------


def json_handler_for(body: object, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


@contextlib.asynccontextmanager
async def preflight_target(
    routes: dict[tuple[str, str], Handler],
) -> AsyncIterator[tuple[SideClient, str]]:
    async with serve(routes) as base_url, SideClient() as client:
        yield client, base_url


async def test_models_lists_ids() -> None:
    listing = {"object": "list", "data": [{"id": "tiny", "object": "model"}, {"id": "draft"}]}
    async with preflight_target({("GET", "/v1/models"): json_handler_for(listing)}) as (client, base_url):
        assert list(await client.models(base_url + "/")) == ["tiny", "draft"]


async def test_models_rejects_a_non_vllm_listing() -> None:
    routes = {("GET", "/v1/models"): json_handler_for({"models": []})}
    async with preflight_target(routes) as (client, base_url):
        with pytest.raises(ServerAnswerError, match="did not list models"):
            await client.models(base_url)


async def test_get_json_non_2xx_raises_with_server_message() -> None:
    body = {"error": {"message": "engine is dead", "type": "InternalServerError", "code": 500}}
    routes = {("GET", "/version"): json_handler_for(body, status=500)}
    async with preflight_target(routes) as (client, base_url):
        with pytest.raises(ServerStatusError) as excinfo:
            await client.get_json(base_url + "/version")
    assert str(excinfo.value) == f"GET {base_url}/version answered HTTP 500: engine is dead"


async def test_get_json_non_json_raises() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html>proxy</html>")

    async with preflight_target({("GET", "/version"): handler}) as (client, base_url):
        with pytest.raises(ServerAnswerError, match="answered with a body that is not JSON"):
            await client.get_json(base_url + "/version")


async def test_get_json_unreachable_names_url_and_what_to_check() -> None:
    base_url = f"http://127.0.0.1:{unused_port()}"
    async with SideClient() as client:
        with pytest.raises(ServerUnreachableError) as excinfo:
            await client.get_json(base_url + "/v1/models")
    message = str(excinfo.value)
    assert message.startswith(f"cannot reach {base_url}/v1/models (ClientConnectorError")
    assert message.endswith("check that the server is running and that the URL is right")
    assert "\n" not in message
