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

Arguments it does not know are accepted and logged the way vLLM logs its CLI at startup
(`non-default args: {...}`), so a launched server's log holds whatever it was given: that is how a
credential passed as `--api-key X` reaches a server log.
"""

from __future__ import annotations

import argparse
import asyncio
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


FAULTS: dict[str, Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]] = {
    "clean": _clean,
    "no_version": _no_version,
    "stream_only": _stream_only,
    "markup_error": _markup_error,
    "gzip_sse": _streamed("gzip"),
    "deflate_sse": _streamed("deflate"),
    "br_sse": _streamed("br"),
    "interleaved": _streamed(None, (0, 1)),
    "plain_sse": _streamed(None),
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
