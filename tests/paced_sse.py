"""A paced OpenAI-style SSE server for capture tests: one token per chunk at an absolute schedule.

Chunk k of a response is due at t_head + k × interval (absolute, so sleeping late never drifts the
schedule), and the time it was actually written is kept: at exit (SIGTERM) the server writes one JSON
line per finished response to --log with its send times, so a test compares what itlaudit stamped with
what was sent. It speaks just enough HTTP/1.1 for a streaming POST and GET /v1/models. Run it as its
own process (`python tests/paced_sse.py --port P --interval-ms 2 --log F`) so its timing is not shared
with the client under test.

`--fault` makes it misbehave in one way, for the capture's fault tests: `stall` (goes silent after
`--fault-after` chunks), `wrong_shape` (choices a list of lists from that chunk on), `invalid_utf8`
(bad bytes in that chunk's text), `not_sse` (200 with application/json), `rate_limit` (the first
request gets 429 with Retry-After: 1), `redirect` (every POST gets 301 to /elsewhere). `--api-key K`
answers every request (GETs included) that lacks `Authorization: Bearer K` with a 401 whose message
echoes the header it got, as OpenAI's API does; the log says per request whether the key matched
(never the key itself). POST /reset_prefix_cache answers 200, or 404 with `--fault no_dev_mode` (vLLM
without VLLM_SERVER_DEV_MODE=1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from typing import Any

MODEL = "paced"


def _chunk(index: int, tokens: int) -> bytes:
    body = {
        "id": "cmpl-paced",
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": "a", "token_ids": [5], "finish_reason": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": tokens},
    }
    if index == -1:
        body["choices"][0]["finish_reason"] = "length"  # type: ignore[index]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _plain_answer(path: str) -> dict[str, Any]:
    """What the preflight and the ledger's identity probe ask for: models, version, one plain token."""
    if path == "/v1/models":
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
    if path == "/version":
        return {"version": "paced"}
    return {
        "id": "cmpl-plain",
        "choices": [{"text": "a", "finish_reason": "length"}],
        "system_fingerprint": None,
    }


def _json_response(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + data


def _http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class PacedServer:
    """Serves and remembers: each request's arrival time, each finished response's send times."""

    def __init__(self, interval_s: float, fault: str, fault_after: int, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.seen: list[dict[str, Any]] = []
        self.interval_s = interval_s
        self.fault = fault
        self.fault_after = fault_after
        self.finished: list[dict[str, Any]] = []
        self.arrivals: list[float] = []

    def _refusal(self) -> bytes | None:
        if self.fault == "rate_limit" and len(self.arrivals) == 1:
            body = b'{"error": {"message": "too many requests"}}'
            return (
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
        if self.fault == "redirect":
            return b"HTTP/1.1 301 Moved Permanently\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
        if self.fault == "not_sse":
            body = b'{"choices": [{"text": "whole answer"}]}'
            return (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
        return None

    def _event(self, k: int, tokens: int) -> bytes:
        if k > self.fault_after and self.fault == "wrong_shape":
            return b'data: {"choices": [[{"text": "a"}]], "usage": {"completion_tokens": "%d"}}\n\n' % k
        if k == self.fault_after + 1 and self.fault == "invalid_utf8":
            return _chunk(k, k).replace(b'"text": "a"', b'"text": "a\xff\xfe"')
        return _chunk(-1 if k == tokens else k, k)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = json.loads(body) if body else {}
            authorization = headers.get("authorization")
            key_ok = self.api_key is None or authorization == f"Bearer {self.api_key}"
            self.seen.append(
                {
                    "method": method,
                    "path": path,
                    "key_ok": key_ok,
                    "headers": sorted(headers),
                    "stream": bool(request.get("stream")),
                }
            )
            if not key_ok:
                message = json.dumps({"error": {"message": f"Incorrect API key provided: {authorization}"}})
                writer.write(
                    b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(message)}\r\nConnection: close\r\n\r\n{message}".encode()
                )
                await writer.drain()
                return
            if path == "/reset_prefix_cache" and self.fault == "no_dev_mode":
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            if method == "GET" or not request.get("stream"):
                writer.write(_json_response(_plain_answer(path)))
                await writer.drain()
                return
            self.arrivals.append(time.monotonic())
            refusal = self._refusal()
            if refusal is not None:
                writer.write(refusal)
                await writer.drain()
                return
            tokens = int(request.get("max_tokens") or 16)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            await writer.drain()
            start = time.monotonic()
            sent: list[float] = []
            for k in range(1, tokens + 1):
                if self.fault == "stall" and k > self.fault_after:
                    await asyncio.sleep(3600)
                delay = start + k * self.interval_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(_http_chunk(self._event(k, tokens)))
                sent.append(time.monotonic())
            writer.write(_http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            self.finished.append(
                {
                    "prompt": request.get("prompt"),
                    "max_tokens": request.get("max_tokens"),
                    "finished": time.monotonic(),
                    "sent": sent,
                }
            )
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault-after", type=int, default=3)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    paced = PacedServer(args.interval_ms / 1000, args.fault, args.fault_after, args.api_key)
    server = await asyncio.start_server(paced.handle, "127.0.0.1", args.port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()
    with open(args.log, "w", encoding="utf-8") as fh:
        json.dump({"finished": paced.finished, "arrivals": paced.arrivals, "seen": paced.seen}, fh)


if __name__ == "__main__":
    asyncio.run(main())
