"""The ground-truth SSE server: it knows when it sent every chunk, so a client's stamps can be graded.

It speaks vLLM's /v1/completions streaming wire format with the simulator's own frame builders (request
validation, chunk layout, usage, [DONE]) but none of its engine: every response's frames are encoded
before its first chunk is due, and ONE timer drives all open streams on a shared grid of absolute
times (tick n is due at n / chunks_per_s on CLOCK_MONOTONIC), as one vLLM engine step feeds every
running request at once. Each chunk's send time is `time.monotonic_ns()` taken right after its
`transport.write` returned, which on loopback means the bytes are in the client's socket buffer (a
write that had to be buffered in user space is counted, so the log says when that was not so).

A raw asyncio protocol rather than aiohttp.web: the timer writes straight to each transport, with no
per-chunk coroutine, awaited drain or chunked-encoding writer between the schedule and the socket.
The loop's own timer wakes up to 1 ms late (epoll has millisecond resolution), so the timer is armed
early and the last stretch is slept precisely; the intended (due) time of each chunk is logged beside
its actual send time, so the server's own lag is part of the record.

Run it in its own process (`python -m itlaudit.serve.truth --port N ...`): sharing an event loop with
the client under test would make the client's stalls the server's.

One module, in the order a request meets it: the config, the responses encoded ahead (templates), the
HTTP/1.1 protocol, the server with its timer and send log, and the process entry.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from itlaudit.errors import SimError
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.model.sendlog import SendLog
from itlaudit.serve.sim.config import SIM_VERSION, SimConfig
from itlaudit.serve.sim.endpoints import CompletionApi
from itlaudit.serve.sim.engine import Job, Step
from itlaudit.serve.sim.validation import parse_job
from itlaudit.serve.sim.vocab import FIRST_REGULAR_TOKEN_ID, avoid_token, token_bytes
from itlaudit.serve.sim.wire import (
    DONE_FRAME,
    ResponseContext,
    bad_request,
    chunk_envelope,
    dump_json,
    error_body,
    model_list,
    rejection_body,
    sse_frame,
    usage_info,
)

# How long before a tick the loop's timer is armed; the rest is slept with nanosleep's precision.
_EARLY_WAKE_NS = 1_200_000
_REALTIME_PRIORITY = 10


@dataclass(frozen=True)
class TruthConfig:
    """The load the server imposes: every stream gets one chunk of `tokens_per_chunk` tokens per tick."""

    chunks_per_s: float = 500.0
    tokens_per_chunk: int = 1
    ttft_ms: float = 20.0  # as the simulator: headers go out first, the first chunk after "prefill"
    model: str = "truth"
    max_model_len: int = 1 << 20

    def __post_init__(self) -> None:
        if self.chunks_per_s <= 0 or self.tokens_per_chunk < 1 or self.ttft_ms < 0:
            raise ValueError("chunks_per_s > 0, tokens_per_chunk >= 1 and ttft_ms >= 0 are required")

    @property
    def period_ns(self) -> int:
        return round(1e9 / self.chunks_per_s)

    def sim_config(self) -> SimConfig:
        """The simulator settings whose validation and frame layout the truth server borrows."""
        return SimConfig(model=self.model, max_model_len=self.max_model_len)


# --- Responses, encoded ahead: one template per request shape, spliced per request ----------------


# Stands in for the response id while a response's frames are encoded once per request shape.
_ID_SENTINEL = "cmpl-@truth-response-id@"
_CHUNKED_END = b"0\r\n\r\n"


@dataclass
class Template:
    """A response's frames with the id cut out: encoded once per request shape, spliced per request."""

    chunks: list[tuple[bytes, bytes]]  # (before id, after id) of each content chunk's SSE frame
    tokens: list[int]  # cumulative completion tokens after each content chunk
    tail: list[tuple[bytes, bytes]]  # usage-only chunk (if any); [DONE] has no id


def _split(frame: bytes) -> tuple[bytes, bytes]:
    before, sentinel, after = frame.partition(_ID_SENTINEL.encode())
    assert sentinel, "every chunk carries the response id"
    return before, after


def _chunked(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece)


def build_template(job: Job, config: TruthConfig) -> Template:
    """The chunk sequence vLLM would stream for this job, `tokens_per_chunk` tokens per chunk, with the
    simulator's builders (continuous usage, token ids, finish_reason on the last chunk, usage-only chunk,
    fingerprint placement). Token ids are a fixed pseudo-random text; their content is not the point."""
    sim = config.sim_config()
    api = CompletionApi()
    ctx = ResponseContext(
        request_id=_ID_SENTINEL,
        created=int(time.time()),
        model=sim.model,
        fingerprint=sim.system_fingerprint,
        job=job,
    )
    rng = random.Random(0)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    prompt_len = len(job.prompt_token_ids)
    chunks: list[tuple[bytes, bytes]] = []
    tokens: list[int] = []
    emitted = 0
    while emitted < job.max_tokens:
        ids = [
            rng.randrange(FIRST_REGULAR_TOKEN_ID, sim.vocab_size)
            for _ in range(min(config.tokens_per_chunk, job.max_tokens - emitted))
        ]
        ids = [avoid_token(i, {sim.eos_token_id}, sim) for i in ids]
        text = "".join(decoder.decode(token_bytes(i, sim)) for i in ids)
        first = emitted == 0
        emitted += len(ids)
        step = Step(token_ids=ids, text=text, finish_reason="length" if emitted >= job.max_tokens else None)
        usage = api.chunk_usage(prompt_len, emitted) if job.continuous_usage else None
        fingerprint = ctx.fingerprint if step.finish_reason and not job.include_usage else None
        choice = api.stream_choice(ctx, step, first)
        chunks.append(_split(sse_frame(chunk_envelope(ctx, api.chunk_object, [choice], usage, fingerprint))))
        tokens.append(emitted)
    tail = []
    if job.include_usage:
        usage_chunk = chunk_envelope(
            ctx, api.chunk_object, [], usage_info(prompt_len, emitted), ctx.fingerprint
        )
        tail.append(_split(sse_frame(usage_chunk)))
    return Template(chunks=chunks, tokens=tokens, tail=tail)


class ScheduledStream:
    """One open response: its chunk-framed bytes, ready to write, and where it is in its schedule."""

    def __init__(self, conn: Connection, response_id: str, template: Template, first_due_ns: int) -> None:
        rid = response_id.encode()
        self.conn = conn
        self.response_id = response_id
        self.frames = [_chunked(before + rid + after) for before, after in template.chunks]
        self.tokens = template.tokens
        self.tail = b"".join(_chunked(b + rid + a) for b, a in template.tail) + _chunked(DONE_FRAME)
        self.tail += _CHUNKED_END
        self.next_index = 0
        self.first_due_ns = first_due_ns

    @property
    def finished(self) -> bool:
        return self.next_index >= len(self.frames) or self.conn.closed


# --- HTTP/1.1: a raw asyncio protocol with keep-alive, its routes and JSON replies ----------------


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
_MAX_HEAD_BYTES = 64 * 1024


def _json_reply(status: int, obj: JSONMapping, keep_alive: bool) -> bytes:
    body = dump_json(obj).encode()
    phrase = HTTPStatus(status).phrase
    connection = b"" if keep_alive else b"connection: close\r\n"
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%b\r\n%b" % (
        status,
        phrase.encode(),
        len(body),
        connection,
        body,
    )


# vLLM 0.32.0's /metrics (the testbed's tiny model, ngram K3, after three requests): what the truth
# server answers GET /metrics with, so a sampler scrapes and parses a page of the real size and shape.
VLLM_METRICS_PAGE = (Path(__file__).parent.parent / "data" / "vllm-0.32-metrics.prom").read_bytes()


def _text_reply(body: bytes, keep_alive: bool) -> bytes:
    connection = b"" if keep_alive else b"connection: close\r\n"
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: %d\r\n%b\r\n%b" % (
        len(body),
        connection,
        body,
    )


class Connection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies: what aiohttp and urllib clients send."""

    def __init__(self, server: TruthServer) -> None:
        self.server = server
        self.buffer = b""
        self.closed = False
        self.streaming = False
        self.close_after = False
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.streaming and not self.closed:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buffer) > _MAX_HEAD_BYTES:
                    self._reply(431, {"error": "request head too large"}, keep_alive=False)
                return
            lines = self.buffer[:head_end].decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buffer) < head_end + 4 + length:
                return
            body = self.buffer[head_end + 4 : head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length :]
            self.close_after = headers.get("connection", "").lower() == "close"
            self._dispatch(method, path, headers, body)

    def _reply(self, status: int, obj: JSONMapping, keep_alive: bool | None = None) -> None:
        keep = not self.close_after if keep_alive is None else keep_alive
        self.transport.write(_json_reply(status, obj, keep))
        if not keep:
            self.transport.close()
            self.closed = True

    def stream_done(self) -> None:
        self.streaming = False
        if self.close_after:
            self.transport.close()
        elif self.buffer:
            self.data_received(b"")

    def _dispatch(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        server = self.server
        routes: dict[tuple[str, str], Callable[[], JSONMapping]] = {
            ("GET", "/health"): dict,
            ("GET", "/version"): lambda: {"version": SIM_VERSION},
            ("GET", "/v1/models"): lambda: model_list(server.sim),
            ("GET", "/truth/log"): server.log_json,
            ("POST", "/truth/reset"): server.reset,
        }
        route = routes.get((method, path))
        if route is not None:
            self._reply(200, route())
            return
        if (method, path) == ("GET", "/metrics"):
            # A real vLLM page, so a /metrics sampler beside a fidelity trial costs what it costs on vLLM.
            keep = not self.close_after
            self.transport.write(_text_reply(VLLM_METRICS_PAGE, keep))
            if not keep:
                self.transport.close()
                self.closed = True
            return
        if (method, path) != ("POST", "/v1/completions"):
            status = HTTPStatus.NOT_FOUND
            self._reply(status, error_body(f"no route {method} {path}", "NotFoundError", None, status))
            return
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise bad_request("request body must be a JSON object", "body")
            job = parse_job(CompletionApi(), request, server.sim)
            if not job.stream or job.logprobs is not None:
                raise bad_request("the truth server only streams, without logprobs", "stream")
        except ValueError as exc:
            status = HTTPStatus.BAD_REQUEST
            self._reply(status, error_body(f"invalid JSON: {exc}", "BadRequestError", "body", status))
            return
        except SimError as exc:
            self._reply(exc.status, rejection_body(exc))
            return
        request_id = headers.get("x-request-id") or f"{uuid.uuid4().int & (2**64 - 1):016x}"
        template = server.template_for(job)
        self.streaming = True
        self.transport.write(_SSE_HEAD)
        stream = ScheduledStream(
            self, f"cmpl-{request_id}", template, server.first_due_ns(time.monotonic_ns())
        )
        server.start_stream(stream)


# --- The server: the streams, the one timer, the send log ----------------------------------------


class TruthServer:
    """Owns the streams, the one timer and the send log."""

    def __init__(self, config: TruthConfig) -> None:
        self.config = config
        self.sim = config.sim_config()
        self.log = SendLog(server={"kind": "truth", **asdict(config)})
        self.buffered_writes = self.closed_early = 0
        self.streams: list[ScheduledStream] = []
        self.templates: dict[tuple[Any, ...], Template] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick_due_ns = 0

    # -- the timer -------------------------------------------------------------------------------------

    def start_stream(self, stream: ScheduledStream) -> None:
        self.streams.append(stream)
        if self._timer is None or stream.first_due_ns < self._tick_due_ns:
            self._arm(stream.first_due_ns)

    def _arm(self, due_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._tick_due_ns = due_ns
        delay_s = max(0.0, (due_ns - _EARLY_WAKE_NS - time.monotonic_ns()) / 1e9)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._tick)

    def _tick(self) -> None:
        due = self._tick_due_ns
        remaining = due - time.monotonic_ns()
        if remaining > 0:
            time.sleep(remaining / 1e9)
        record, monotonic_ns = self.log.record, time.monotonic_ns
        for stream in self.streams:
            if stream.conn.closed or due < stream.first_due_ns:
                continue
            index = stream.next_index
            transport = stream.conn.transport
            transport.write(stream.frames[index])
            sent = monotonic_ns()
            record(stream.response_id, due, sent, stream.tokens[index])
            if transport.get_write_buffer_size():
                self.buffered_writes += 1
            stream.next_index = index + 1
            if stream.next_index == len(stream.frames):
                transport.write(stream.tail)
                stream.conn.stream_done()
        for stream in self.streams:
            if stream.finished and stream.next_index < len(stream.frames):
                self.closed_early += 1
        self.streams = [s for s in self.streams if not s.finished]
        self._timer = None
        if self.streams:
            self._arm(due + self.config.period_ns)

    def first_due_ns(self, now_ns: int) -> int:
        """The first grid tick at or after the request's arrival plus TTFT."""
        period = self.config.period_ns
        earliest = now_ns + round(self.config.ttft_ms * 1e6)
        return -(-earliest // period) * period

    # -- requests ----------------------------------------------------------------------------------------

    def template_for(self, job: Job) -> Template:
        key = (
            tuple(job.prompt_token_ids) if job.return_token_ids else len(job.prompt_token_ids),
            job.max_tokens,
            job.include_usage,
            job.continuous_usage,
            job.return_token_ids,
        )
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = build_template(job, self.config)
        return template

    def reset(self) -> JSONObject:
        """Start a new log (streams still open keep their schedule), so one server serves many trials;
        the answer is an empty JSON object."""
        self.log = SendLog(server={**self.log.server, "kind": "truth", **asdict(self.config)})
        self.buffered_writes = self.closed_early = 0
        return {}

    def log_json(self) -> JSONMapping:
        """The send log's JSON form (model.sendlog), with this server's write counters in its block."""
        self.log.server["buffered_writes"] = self.buffered_writes
        self.log.server["streams_closed_early"] = self.closed_early
        return self.log.to_json()


def raise_priority() -> str:
    """Best effort: on a shared machine the stick must not wait for a core. The server sleeps between
    ticks, so a real-time class costs others nothing but its own short bursts of writes."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_REALTIME_PRIORITY))
        return f"SCHED_FIFO {_REALTIME_PRIORITY}"
    except (AttributeError, OSError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "default"


async def serve_truth(config: TruthConfig, host: str, port: int, log_path: Path | None) -> None:
    """Serve until SIGTERM/SIGINT, then write the send log (when asked to)."""
    server = TruthServer(config)
    server.log.server["scheduling"] = raise_priority()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Connection(server), host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with listener:
        await stop.wait()
    if log_path is not None:
        log_path.write_text(json.dumps(server.log_json()), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m itlaudit.serve.truth", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks-per-s", type=float, default=TruthConfig.chunks_per_s)
    parser.add_argument("--tokens-per-chunk", type=int, default=TruthConfig.tokens_per_chunk)
    parser.add_argument("--ttft-ms", type=float, default=TruthConfig.ttft_ms)
    parser.add_argument("--model", default=TruthConfig.model)
    parser.add_argument("--log", type=Path, help="write the send log here on exit (also GET /truth/log)")
    args = parser.parse_args(argv)
    try:
        config = TruthConfig(args.chunks_per_s, args.tokens_per_chunk, args.ttft_ms, args.model)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(serve_truth(config, args.host, args.port, args.log))


if __name__ == "__main__":
    main()
