"""Streaming client: sends one request and records what arrived, when, and nothing else.

Timing is the product here, so the read loop is kept lean: the receipt time of each TCP read is taken
before any parsing and given to every SSE event that read completed (a read that carries three
events carries three tokens' worth of arrivals at one instant, which is exactly what the server
sent); each event is JSON-decoded once; nothing is logged per chunk. The time spent parsing is
summed into `client_overhead_ms` so a saturated client shows up in the record instead of being
mistaken for server latency.

Failures are data, not exceptions: an HTTP error, an error frame or a dropped connection ends up in
the record's status with every chunk received before it, so a run never loses what it observed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from itlaudit.errors import ServerRejectedError, ServerUnreachableError
from itlaudit.records import (
    STATUS_CONNECTION_ERROR,
    STATUS_HTTP_ERROR,
    STATUS_STREAM_ERROR,
    RequestParams,
    RequestRecord,
)
from itlaudit.sse import SSEParser

ENDPOINT_COMPLETIONS = "completions"
ENDPOINT_CHAT = "chat"
ENDPOINT_PATHS = {
    ENDPOINT_COMPLETIONS: "/v1/completions",
    ENDPOINT_CHAT: "/v1/chat/completions",
}

_DONE = "[DONE]"
_ERROR_BODY_CHARS = 300
_JSON_HEADERS = {"Content-Type": "application/json"}
# Everything that means "the network or the server went away", as opposed to a bug in this code.
_CONNECTION_FAILURES = (aiohttp.ClientError, TimeoutError, OSError)


def build_body(
    endpoint: str,
    model: str,
    prompt: str,
    params: RequestParams,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON. Unset limits are left out rather than sent as null or defaults, because
    what a request leaves to the server (e.g. no max_tokens) is itself what some findings audit.

    Continuous usage stats are what make token-true ITL possible: every chunk then carries the
    server's cumulative completion_tokens. `extra_body` is applied last (shallow) so a scenario can
    override anything, including the stream options.
    """
    body: dict[str, Any] = {"model": model}
    if endpoint == ENDPOINT_COMPLETIONS:
        body["prompt"] = prompt
    elif endpoint == ENDPOINT_CHAT:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {sorted(ENDPOINT_PATHS)}")
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body["return_token_ids"] = True
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.min_tokens is not None:
        body["min_tokens"] = params.min_tokens
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if params.seed is not None:
        body["seed"] = params.seed
    if extra_body:
        body.update(extra_body)
    return body


async def stream_request(
    session: aiohttp.ClientSession,
    *,
    base_url: str,
    endpoint: str,
    model: str,
    prompt: str,
    params: RequestParams,
    request_id: str,
    variant: str,
    extra_body: dict[str, Any] | None = None,
    timeout_s: float = 600.0,
) -> RequestRecord:
    """Send one streaming request and return its record; network and server failures are recorded
    in `status`/`error`, never raised.

    `t0` is taken after the body is serialised, immediately before the POST, so TTFT covers
    connecting and the server's queueing but not our own JSON encoding. Records assume n=1: text,
    token ids and finish_reason come from choices[0].
    """
    body = build_body(endpoint, model, prompt, params, extra_body)
    url = base_url.rstrip("/") + ENDPOINT_PATHS[endpoint]
    record = RequestRecord(
        request_id=request_id, variant=variant, endpoint=endpoint, url=url, model=model, params=params
    )
    payload = json.dumps(body).encode()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    record.started_at_unix = time.time()
    t0 = time.monotonic_ns()
    try:
        async with session.post(url, data=payload, headers=_JSON_HEADERS, timeout=timeout) as resp:
            record.http_status = resp.status
            if resp.status != 200:
                error_body = await resp.read()
                record.e2e_ms = (time.monotonic_ns() - t0) / 1e6
                record.status = STATUS_HTTP_ERROR
                record.error = server_error_message(error_body, resp.status)
                return record
            await _read_stream(resp, record, t0, endpoint == ENDPOINT_CHAT)
    except _CONNECTION_FAILURES as exc:
        record.status = STATUS_CONNECTION_ERROR
        record.error = _describe_connection_failure(exc, timeout_s)
        if record.e2e_ms is None:
            record.e2e_ms = (time.monotonic_ns() - t0) / 1e6
    return record


async def _read_stream(resp: aiohttp.ClientResponse, record: RequestRecord, t0: int, is_chat: bool) -> None:
    """The hot loop. Chunk arrays are appended through local bound methods; the record's text, e2e
    and overhead are filled in a `finally` so a connection dropped mid-stream still leaves a record
    with everything received up to the drop (e2e then runs to the last data that arrived).
    """
    parser = SSEParser()
    chunks = record.chunks
    append_t_ms = chunks.t_ms.append
    append_tokens = chunks.completion_tokens.append
    append_text_len = chunks.text_len.append
    append_has_choice = chunks.has_choice.append
    append_token_ids = chunks.token_ids.append
    text_parts: list[str] = []
    overhead_ns = 0
    received_ns = t0
    monotonic_ns = time.monotonic_ns
    try:
        async for piece in resp.content.iter_any():
            received_ns = monotonic_ns()
            events = parser.feed(piece)
            if events:
                t_ms = (received_ns - t0) / 1e6
                for event in events:
                    data = event.data
                    if data == _DONE:
                        record.done_sentinel = True
                        continue
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        record.status = STATUS_STREAM_ERROR
                        record.error = f"server sent a data event that is not JSON: {data[:100]!r}"
                        continue
                    if not isinstance(obj, dict):
                        record.status = STATUS_STREAM_ERROR
                        record.error = f"server sent a data event that is not a JSON object: {data[:100]!r}"
                        continue
                    error = obj.get("error")
                    if error is not None:
                        record.status = STATUS_STREAM_ERROR
                        record.error = _error_frame_message(error)
                        continue

                    usage = obj.get("usage")
                    completion_tokens = None
                    if usage:
                        completion_tokens = usage.get("completion_tokens")
                        record.completion_tokens = completion_tokens
                        record.prompt_tokens = usage.get("prompt_tokens")
                    choices = obj.get("choices")
                    text = None
                    token_ids = None
                    if choices:
                        choice = choices[0]
                        if is_chat:
                            delta = choice.get("delta")
                            text = delta.get("content") if delta else None
                        else:
                            text = choice.get("text")
                        token_ids = choice.get("token_ids")
                        finish_reason = choice.get("finish_reason")
                        if finish_reason is not None:
                            record.finish_reason = finish_reason
                            record.stop_reason = choice.get("stop_reason")
                    append_t_ms(t_ms)
                    append_tokens(completion_tokens)
                    append_has_choice(bool(choices))
                    append_token_ids(token_ids)
                    if text:
                        append_text_len(len(text))
                        text_parts.append(text)
                    else:
                        append_text_len(0)
                    if record.response_id is None:
                        record.response_id = obj.get("id")
                    fingerprint = obj.get("system_fingerprint")
                    if fingerprint is not None:
                        record.system_fingerprint = fingerprint
            overhead_ns += monotonic_ns() - received_ns
    finally:
        record.text = "".join(text_parts)
        record.e2e_ms = (received_ns - t0) / 1e6
        record.client_overhead_ms = overhead_ns / 1e6


def _error_frame_message(error: object) -> str:
    """vLLM reports an engine failure mid-stream as `data: {"error": {"message": ...}}`."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return str(error)


def server_error_message(body: bytes, http_status: int) -> str:
    """vLLM's own explanation from an error body, across the shapes its versions have used:
    `{"error": {"message": ...}}` (recent), `{"message": ...}` / `{"object": "error", "message": ...}`
    (older), FastAPI's `{"detail": ...}` (unknown routes); otherwise the start of the raw body.
    """
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for key in ("message", "detail", "error"):
            if isinstance(obj.get(key), str):
                return obj[key]
    text = text.strip()
    return text[:_ERROR_BODY_CHARS] if text else f"HTTP {http_status} with an empty body"


def _describe_connection_failure(exc: BaseException, timeout_s: float) -> str:
    """One line for the record: aiohttp messages can span lines and a bare TimeoutError has none."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"TimeoutError: no complete response within {timeout_s:g} s"
    detail = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


async def fetch_json(
    session: aiohttp.ClientSession, base_url: str, path: str, *, timeout_s: float = 30.0
) -> dict[str, Any]:
    """GET a small JSON document for preflight checks; unlike `stream_request` this raises, because
    a server that cannot answer a preflight makes the whole run pointless."""
    url = base_url.rstrip("/") + path
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.read()
            http_status = resp.status
    except _CONNECTION_FAILURES as exc:
        raise ServerUnreachableError(
            f"cannot reach {url} ({_describe_connection_failure(exc, timeout_s)}); "
            "check that the server is running and that the URL is right"
        ) from None
    if not 200 <= http_status < 300:
        raise ServerRejectedError(
            f"{url} answered HTTP {http_status}: {server_error_message(body, http_status)}"
        )
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise ServerRejectedError(
            f"{url} did not answer with a JSON object (got {body[:100]!r}); is this a vLLM server?"
        )
    return obj


async def fetch_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """Served model names, so a run can fail fast on a misspelt --model instead of 404ing per request."""
    url_path = "/v1/models"
    listing = await fetch_json(session, base_url, url_path)
    entries = listing.get("data")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ServerRejectedError(
            f"{base_url.rstrip('/')}{url_path} did not list models as {{'data': [{{'id': ...}}]}}; "
            "is this a vLLM server?"
        )
    return [str(e["id"]) for e in entries]
