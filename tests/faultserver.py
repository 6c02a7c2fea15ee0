"""A misbehaving OpenAI-compatible server for end-to-end fault tests: the simulator (itlaudit.serve.sim) with
one fault mode layered on top, run as its own process like a real server.

    python tests/faultserver.py --port PORT --mode MODE [--step-ms MS] [--request-log PATH] [...]

Modes (one per fault; add new ones to FAULTS):
- clean: the simulator as is (with the request log).
- no_version: /version answers 404, as SGLang, TGI, gateways and mock servers do.
- stream_only: any non-streaming completion is refused with HTTP 400 (streaming-only proxies).
- markup_error: every completion fails with HTTP 500 whose message is HTML markup.
- gzip_sse / deflate_sse / br_sse: the stream is sent with that Content-Encoding whatever the request's
  Accept-Encoding says (gzip and deflate really compressed, flushed after every event as a streaming
  proxy does; br only labelled, since nothing may decode it).
- interleaved: a streamed completion interleaves choices[].index 0 and 1, as n=2 forced server-side.
- plain_sse: the same hand-written stream with one choice and no coding (the clean neighbour of both).
- auth_echo: a 401 quoting every header value it got, for the identity ping and every second stream
  (row N15).

The fault campaign's stream and framing modes (docs/faults.md; completions endpoint, every streamed
completion; other requests go to the simulator):
- stall_headers: 200 and the event-stream headers, then silence (row 2).
- not_json / event_error: two good events, then a data line that is not JSON / an `event: error` whose
  data is vLLM's `{"error": {...}}` (rows 6, 14).
- usage_backwards / usage_partial: completion_tokens goes 1 2 3 2 5 …, or rides on the first two
  events and the last only (row 10).
- unavailable: HTTP 503 with Retry-After: 1; html_500: HTTP 500 with an HTML page (row 7).
- redirect_307 / redirect_loop: 307 to another path / to the same one (rows 8, N17).
- drip: one byte of the first event every 200 ms, forever (N18).
- event_5mb: the whole reply in one event of 5 MB of text (row 4).
- close_delimited: an HTTP/1.0 response whose body ends when the connection closes (N21).
- bad_chunk: chunked framing whose third chunk size is not hex (N22).

Issue 39's bounds (rows R3, R6):
- endless_line: two good events, then a data line that never ends, 1 MiB a write until the client
  leaves (R3).
- big_pages: /metrics answers 50 MB of Prometheus comment lines with its Content-Length; /dcgm answers
  the H200 dcgm-exporter fixture page for its first `after` requests (a query parameter, default 0),
  then that page padded with comment lines to 50 MB, written 1 MiB at a time with no length stated
  (R6). Completions go to the simulator.

Arguments it does not know are accepted and logged the way vLLM logs its CLI at startup
(`non-default args: {...}`), so a launched server's log holds whatever it was given: that is how a
credential passed as `--api-key X` reaches a server log.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from itlaudit.serve.sim import SimConfig, make_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MARKUP = '<img src=x onerror="alert(1)"> **bold** [link](http://x)'
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "FaultServerError", "param": None, "code": status}}
    return web.json_response(body, status=status)


async def _no_version(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path == "/version":
        return _error(404, "Not Found")
    return await handler(request)


async def _stream_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in COMPLETION_PATHS and not (await request.json()).get("stream"):
        return _error(400, "this server only streams; set stream=true")
    return await handler(request)


async def _markup_error(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in COMPLETION_PATHS:
        return _error(500, f"engine failed: {MARKUP}")
    return await handler(request)


async def _own_stream(
    request: web.Request, handler: Handler, coding: str | None, indices: tuple[int, ...]
) -> web.StreamResponse:
    """A streamed completion written here rather than by the simulator: max_tokens events per choice
    index (round robin over `indices`), the last with finish_reason and usage, then [DONE]; the body
    compressed per `coding` with a flush after every event."""
    if request.path not in COMPLETION_PATHS:
        return await handler(request)
    body = await request.json()
    if not body.get("stream"):
        return await handler(request)
    chat = request.path.endswith("/chat/completions")
    tokens = int(body.get("max_tokens") or 16)
    headers = {
        "Content-Type": "text/event-stream",
        "X-Accept-Encoding-Seen": request.headers.get("Accept-Encoding", ""),
    }
    if coding is not None:
        headers["Content-Encoding"] = coding
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(coding or "")
    compressor = zlib.compressobj(wbits=wbits) if wbits is not None else None

    async def send(event: dict[str, object] | str, last: bool = False) -> None:
        data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
        if compressor is not None:
            data = compressor.compress(data) + compressor.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
        await response.write(data)

    for step in range(tokens):
        for index in indices:
            word = f" {'abcdefgh'[index]}{step + 1}"
            choice: dict[str, object] = {"index": index, "finish_reason": None}
            choice.update({"delta": {"content": word}} if chat else {"text": word})
            if step == tokens - 1:
                choice["finish_reason"] = "length"
            sent = step * len(indices) + indices.index(index) + 1  # continuous usage, over every choice
            usage = {"prompt_tokens": 1, "completion_tokens": sent}
            chunk: dict[str, object] = {"id": "cmpl-fault", "choices": [choice], "usage": usage}
            await send(chunk)
        await asyncio.sleep(0.002)
    await send("[DONE]", last=True)
    await response.write_eof()
    return response


def _streamed(
    coding: str | None, indices: tuple[int, ...] = (0,)
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    async def fault(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await _own_stream(request, handler, coding, indices)

    return fault


async def _clean(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await handler(request)


async def _streamed_completion(request: web.Request) -> bool:
    """Whether the request is a streamed completion, the only kind the campaign's modes answer."""
    return request.path in COMPLETION_PATHS and bool((await request.json()).get("stream"))


def _event(text: str, tokens: int | None, finish: str | None = None) -> bytes:
    """One completions event carrying `text`, with usage when `tokens` is given."""
    body: dict[str, object] = {
        "id": "cmpl-fault",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    if tokens is not None:
        body["usage"] = {"prompt_tokens": 1, "completion_tokens": tokens}
    return f"data: {json.dumps(body)}\n\n".encode()


def _events(
    pieces: Callable[[int], list[bytes]], gap_s: float = 0.005
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A fault whose streamed completion is exactly `pieces(max_tokens)` (event-stream bytes), `gap_s`
    apart (5 ms: at 2 ms a loaded 2-core box merges events into one read, chunks_coalesced)."""

    async def fault(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not await _streamed_completion(request):
            return await handler(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces(int((await request.json()).get("max_tokens") or 16)):
            await response.write(piece)
            await asyncio.sleep(gap_s)
        await response.write_eof()
        return response

    return fault


def _words(usage: list[int | None]) -> list[bytes]:
    """len(usage) events " a1", " a2", … with those completion_tokens, the last with finish_reason,
    then [DONE]."""
    last = len(usage) - 1
    events = [_event(f" a{i + 1}", n, "length" if i == last else None) for i, n in enumerate(usage)]
    return [*events, b"data: [DONE]\n\n"]


def _broken(tail: bytes) -> Callable[[int], list[bytes]]:
    """Two good events (kept: the text before a fault is the record's), then `tail`."""
    return lambda _: [_event(" a1", 1), _event(" a2", 2), tail, b"data: [DONE]\n\n"]


def _one_event(size: int) -> Callable[[int], list[bytes]]:
    """The whole reply as one event of `size` bytes of words, then a finish event at max_tokens and
    [DONE]."""

    def pieces(max_tokens: int) -> list[bytes]:
        text = (" lorem ipsum dolor sit amet" * (size // 27 + 1))[:size]
        return [_event(text, max_tokens - 1), _event("", max_tokens, "length"), b"data: [DONE]\n\n"]

    return pieces


async def _stall_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not await _streamed_completion(request):
        return await handler(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    # Silent until the client gives up (aiohttp does not cancel a handler whose client left, and a
    # handler still sleeping would hold the server's shutdown).
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.05)
    return response


async def _drip(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Never silent for long, never done: a stall limit cannot see it, only a total limit can."""
    if not await _streamed_completion(request):
        return await handler(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for byte in _event(" a1", 1) * 1000:
        await response.write(bytes([byte]))
        await asyncio.sleep(0.2)
    return response


def _status(
    status: int, headers: Callable[[web.Request], dict[str, str]], body: str, content_type: str
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Every completion answered with `status`, `headers(request)` and `body`."""

    async def fault(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in COMPLETION_PATHS:
            return await handler(request)
        return web.Response(status=status, headers=headers(request), text=body, content_type=content_type)

    return fault


def _raw(
    head: bytes, body: Callable[[], list[bytes]]
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A streamed completion written as raw bytes on the socket (framing aiohttp will not produce:
    HTTP/1.0 close-delimited, broken chunk sizes), then the connection closed."""

    async def fault(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not await _streamed_completion(request) or request.transport is None:
            return await handler(request)
        transport = request.transport
        transport.write(head)
        for piece in body():
            transport.write(piece)
            await asyncio.sleep(0.002)
        transport.close()
        return web.Response()  # never sent: the connection is closed

    return fault


async def _endless_line(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not await _streamed_completion(request):
        return await handler(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_event(" a1", 1) + _event(" a2", 2) + b"data: ")
    while request.transport is not None and not request.transport.is_closing():
        await response.write(_padding(MIB))
    return response


MIB = 1 << 20
PAGE_BYTES = 50_000_000
DCGM_PAGE = Path(__file__).parent / "fixtures" / "gpu" / "dcgm-exporter-h200.prom"


@functools.cache
def _padding(size: int) -> bytes:
    """`size` bytes of Prometheus comment lines: valid text that holds nothing (built on first use)."""
    line = b"# padding: a comment line, valid Prometheus text and nothing in it\n"
    return (line * (size // len(line) + 1))[:size]


def _big_pages() -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The big_pages mode; counts /dcgm requests per query string for `after`."""
    served: dict[str, int] = {}
    small = DCGM_PAGE.read_bytes()

    async def fault(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/metrics":
            return web.Response(body=_padding(PAGE_BYTES), content_type="text/plain")
        if request.path != "/dcgm":
            return await handler(request)
        served[request.query_string] = served.get(request.query_string, 0) + 1
        if served[request.query_string] <= int(request.query.get("after", "0")):
            return web.Response(body=small, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        page = small + _padding(PAGE_BYTES - len(small))
        for start in range(0, len(page), MIB):
            if request.transport is None or request.transport.is_closing():
                break
            await response.write(page[start : start + MIB])
        return response

    return fault


def _chunked(pieces: list[bytes]) -> list[bytes]:
    return [f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for piece in pieces]


_AUTH_ECHO_STREAMS = itertools.count(1)


async def _auth_echo(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A 401 that quotes every header value it was sent (as gateways quote the key they refuse), for a
    non-streaming completion (the identity ping) and for every second streamed one; the rest is
    served, so a run goes on with the echoes in its records and on its terminal (fault row N15)."""
    if request.path not in COMPLETION_PATHS:
        return await handler(request)
    if (await request.json()).get("stream") and next(_AUTH_ECHO_STREAMS) % 2:
        return await handler(request)
    quoted = "; ".join(f"{name}={value}" for name, value in request.headers.items())
    return _error(401, f"Unauthorized: rejected {quoted}")


SSE_HEAD = "HTTP/{}\r\nContent-Type: text/event-stream\r\n{}\r\n"


FAULTS: dict[str, Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]] = {
    "clean": _clean,
    "auth_echo": _auth_echo,
    "no_version": _no_version,
    "stream_only": _stream_only,
    "markup_error": _markup_error,
    "gzip_sse": _streamed("gzip"),
    "deflate_sse": _streamed("deflate"),
    "br_sse": _streamed("br"),
    "interleaved": _streamed(None, (0, 1)),
    "plain_sse": _streamed(None),
    "stall_headers": _stall_headers,
    "not_json": _events(_broken(b"data: this is not json at all\n\n")),
    "event_error": _events(
        _broken(
            b'event: error\ndata: {"error": {"message": "engine died", "type": "InternalServerError"}}\n\n'
        )
    ),
    "usage_backwards": _events(lambda _: _words([1, 2, 3, 2, 5, 6, 7, 8])),
    "usage_partial": _events(lambda _: _words([1, 2, None, None, None, None, None, 8])),
    "unavailable": _status(
        503, lambda _: {"Retry-After": "1"}, '{"error": {"message": "overloaded"}}', "application/json"
    ),
    "html_500": _status(
        500, lambda _: {}, "<html><body><h1>500 Internal Server Error</h1></body></html>", "text/html"
    ),
    "redirect_307": _status(307, lambda _: {"Location": "/v2/completions"}, "", "text/plain"),
    "redirect_loop": _status(307, lambda request: {"Location": request.path}, "", "text/plain"),
    "drip": _drip,
    "event_5mb": _events(_one_event(5_000_000)),
    "endless_line": _endless_line,
    "big_pages": _big_pages(),
    "close_delimited": _raw(
        SSE_HEAD.format("1.0 200 OK", "").encode(), lambda: _words([1, 2, 3, 4, 5, 6, 7, 8])
    ),
    "bad_chunk": _raw(
        SSE_HEAD.format("1.1 200 OK", "Transfer-Encoding: chunked\r\n").encode(),
        lambda: [*_chunked(_words([1, 2, 3, 4])[:2]), b"zz\r\n"],
    ),
}


def request_logger(path: Path | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """One JSON line per request (path, whether it streamed, monotonic start/end), to show what landed
    inside a /metrics window."""

    @web.middleware
    async def log(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        stream = None
        if request.method == "POST" and request.can_read_body:
            stream = bool((await request.json()).get("stream"))
        response = await handler(request)
        if path is not None:
            line = {"path": request.path, "stream": stream, "start": started, "end": time.monotonic()}
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        return response

    return log


def arrival_logger(path: Path) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """One line per request the moment it arrives (path and time.monotonic(), the same clock in every
    process of the machine): a request whose client died mid-stream never reaches request_logger's
    line, but it did arrive."""

    @web.middleware
    async def log(request: web.Request, handler: Handler) -> web.StreamResponse:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"path": request.path, "arrived": time.monotonic()}) + "\n")
        return await handler(request)

    return log


def make_fault_app(
    mode: str, config: SimConfig, request_log: Path | None = None, arrival_log: Path | None = None
) -> web.Application:
    app = make_app(config)
    if arrival_log is not None:
        app.middlewares.append(arrival_logger(arrival_log))
    app.middlewares.append(request_logger(request_log))
    app.middlewares.append(web.middleware(FAULTS[mode]))
    return app


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=sorted(FAULTS), default="clean")
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--num-speculative-tokens", type=int, default=0)
    parser.add_argument("--request-log", type=Path)
    parser.add_argument("--arrival-log", type=Path)
    known, unknown = parser.parse_known_args(argv)
    print(f"non-default args: {{'mode': {known.mode!r}, 'extra': {unknown!r}}}", flush=True)
    config = SimConfig(step_ms=known.step_ms, num_speculative_tokens=known.num_speculative_tokens)
    app = make_fault_app(known.mode, config, known.request_log, known.arrival_log)
    web.run_app(app, host="127.0.0.1", port=known.port, access_log=None, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
