"""The truth server's HTTP/1.1: a raw asyncio protocol with keep-alive, its routes and JSON replies."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from itlaudit.errors import SimError
from itlaudit.serve.sim.config import SIM_VERSION
from itlaudit.serve.sim.endpoints import CompletionApi
from itlaudit.serve.sim.validation import parse_job
from itlaudit.serve.sim.wire import bad_request, dump_json, error_body, model_list, rejection_body
from itlaudit.serve.truth_frames import ScheduledStream

__all__ = ["Connection"]

if TYPE_CHECKING:
    from itlaudit.serve.truth import TruthServer


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
_MAX_HEAD_BYTES = 64 * 1024


def _json_reply(status: int, obj: Any, keep_alive: bool) -> bytes:
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

    def _reply(self, status: int, obj: Any, keep_alive: bool | None = None) -> None:
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
        routes: dict[tuple[str, str], Callable[[], Any]] = {
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
