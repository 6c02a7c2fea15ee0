"""Streaming client: sends one request and records what arrived, when, and nothing else.

Timing is the product here, so the read loop only reads, stamps and keeps: each read carries the
stamp of the socket read that delivered it (taken by the transport, before any parsing), every SSE
event that read completed gets that stamp (a read that carries three events carries three tokens'
worth of arrivals at one instant, which is exactly what the server sent), each event is decoded once
into the few fields a record keeps, and nothing is derived, encoded, logged or written here.

Failures are data, not exceptions: an HTTP error, an error frame, a chunk of the wrong shape, a
timeout or a dropped connection ends up in the record's status with every chunk received before it,
so a run never loses what it observed.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from itlaudit.capture.chunk import CHUNK_DECODE_ERRORS, Chunk, decode_chunk
from itlaudit.capture.sse import SSEFramer
from itlaudit.capture.transport import StampMode, Stream, TransportOptions, open_stream
from itlaudit.errors import ConnectTimeout, ServerRejectedError, ServerUnreachableError, TransportError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.records import (
    STATUS_CONNECTION_ERROR,
    STATUS_HTTP_ERROR,
    STATUS_RATE_LIMITED,
    STATUS_STREAM_ERROR,
    STATUS_TIMEOUT,
    RequestParams,
    RequestRecord,
    Timeouts,
)

if TYPE_CHECKING:
    from itlaudit.capture.lagprobe import LagProbe

ENDPOINT_COMPLETIONS = "completions"
ENDPOINT_CHAT = "chat"
ENDPOINT_PATHS = {
    ENDPOINT_COMPLETIONS: "/v1/completions",
    ENDPOINT_CHAT: "/v1/chat/completions",
}

_DONE = b"[DONE]"
_ERROR_BODY_CHARS = 300
_EXCERPT_BYTES = 120
_EVENT_STREAM = "text/event-stream"
_RATE_LIMIT_STATUSES = (429, 503)
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_REFUSAL_BODY_LIMIT = 64 * 1024
_REFUSAL_READ_TIMEOUT_S = 10.0
DEFAULT_TIMEOUTS = Timeouts()
# Everything that means "the network or the server went away", as opposed to a bug in this code.
_CONNECTION_FAILURES = (aiohttp.ClientError, TransportError, TimeoutError, OSError)


def build_body(
    endpoint: str,
    model: str,
    prompt: str | list[int] | list[dict[str, Any]],
    params: RequestParams,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request JSON. Unset limits are left out rather than sent as null or defaults, because
    what a request leaves to the server (e.g. no max_tokens) is itself what some findings audit.

    Continuous usage stats are what make token-true ITL possible: every chunk then carries the
    server's cumulative completion_tokens. `extra_body` is applied last (shallow) so a scenario can
    override anything, including the stream options. A prompt is text, token ids (completions: the
    server takes them as they are) or, for chat, a dataset's whole message list.
    """
    body: dict[str, Any] = {"model": model}
    if endpoint == ENDPOINT_COMPLETIONS:
        body["prompt"] = prompt
    elif endpoint == ENDPOINT_CHAT:
        is_messages = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
        body["messages"] = prompt if is_messages else [{"role": "user", "content": prompt}]
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


@dataclass(frozen=True)
class PlannedRequest:
    """One request, fully prepared before the run starts (body already JSON-encoded), so the capture
    loop does no encoding while other streams are open."""

    request_id: str
    variant: str
    endpoint: str
    url: str
    model: str
    params: RequestParams
    payload: bytes
    scheduled_ms: float | None = None  # open loop: due this long after the variant's start
    warmup: bool = False
    category: str | None = None


def plan_request(
    *,
    base_url: str,
    endpoint: str,
    model: str,
    prompt: str | list[int] | list[dict[str, Any]],
    params: RequestParams,
    request_id: str,
    variant: str,
    extra_body: dict[str, Any] | None = None,
    scheduled_ms: float | None = None,
    warmup: bool = False,
    category: str | None = None,
) -> PlannedRequest:
    body = build_body(endpoint, model, prompt, params, extra_body)
    url = base_url.rstrip("/") + ENDPOINT_PATHS[endpoint]
    payload = json.dumps(body).encode()
    return PlannedRequest(
        request_id, variant, endpoint, url, model, params, payload, scheduled_ms, warmup, category
    )


async def stream_request(
    plan: PlannedRequest,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    probe: LagProbe | None = None,
    stamp: StampMode = "kernel",
    access: Access | None = None,
) -> RequestRecord:
    """Send one streaming request and return its raw record; network and server failures are
    recorded in `status`/`error`, never raised.

    `t0` is the transport's stamp just before the request bytes were written, so TTFT covers
    connecting and the server's queueing but not our own work. Records assume n=1 (the scenario
    rejects n > 1): text, token ids and finish_reason come from choices[0]. With a lag probe, the
    record names the probe samples taken while the stream was open; the writer thread turns them into
    the record's loop-lag figures. `stamp` "kernel" falls back to "loop" where the platform has no
    kernel receive timestamps; `record.stamp` says which ran.
    """
    record = RequestRecord(
        request_id=plan.request_id,
        variant=plan.variant,
        endpoint=plan.endpoint,
        url=plan.url,
        model=plan.model,
        params=plan.params,
        scheduled_ms=plan.scheduled_ms,
        warmup=plan.warmup,
        category=plan.category,
    )
    access = access or NO_ACCESS
    options = TransportOptions(
        stamp=stamp, connect_timeout_s=timeouts.connect_timeout_s, ssl_context=access.ssl_context()
    )
    record.started_at_unix = time.time()
    t0 = time.monotonic_ns()
    record.sent_monotonic_ns = t0
    head_wait_s, head_limit = timeouts.next_wait(t0, t0, False)
    try:
        async with asyncio.timeout(head_wait_s):  # the transport does not time the wait for the head
            stream = await open_stream(plan.url, plan.payload, access.header_map(), options)
    except ConnectTimeout:
        _timed_out(record, "connect_timeout_s", timeouts.connect_timeout_s, t0, time.monotonic_ns())
        return _closed(record, probe)
    except TimeoutError:
        _timed_out(record, head_limit, timeouts.limit(head_limit), t0, time.monotonic_ns())
        return _closed(record, probe)
    except _CONNECTION_FAILURES as exc:
        record.status = STATUS_CONNECTION_ERROR
        record.error = _describe_connection_failure(exc)
        record.e2e_ms = (time.monotonic_ns() - t0) / 1e6
        return _closed(record, probe)
    if probe is not None:
        record.lag_window = (probe.position(), 0)  # from the response head: what the chunk stamps saw
    t0 = stream.t_sent_ns
    record.sent_monotonic_ns = t0
    record.stamp = stream.stamp
    record.http_status = stream.status
    try:
        if stream.status != 200:
            await _read_refusal(stream, record, t0)
        elif not stream.content_type.lower().startswith(_EVENT_STREAM):
            await _read_refusal(stream, record, t0)
            shown = stream.content_type or "none"
            record.status = STATUS_STREAM_ERROR
            record.error = (
                f"HTTP 200 with content type {shown}, not {_EVENT_STREAM}: the server did not stream "
                f"({record.error}); check that it supports stream=true"
            )
        else:
            await _read_stream(stream, record, t0, plan.endpoint == ENDPOINT_CHAT, timeouts)
    finally:
        await stream.aclose()
    return _closed(record, probe)


def _closed(record: RequestRecord, probe: LagProbe | None) -> RequestRecord:
    if probe is not None and record.lag_window is not None:
        record.lag_window = (record.lag_window[0], probe.position())
    return record


async def _read_refusal(stream: Stream, record: RequestRecord, t0: int) -> None:
    """A response that is not a stream: keep the server's explanation, name a redirect's target and
    a rate limit's Retry-After, since those tell the user what to do next."""
    body = b""
    with contextlib.suppress(TimeoutError, *_CONNECTION_FAILURES):
        while len(body) < _REFUSAL_BODY_LIMIT:
            piece = await stream.read(_REFUSAL_READ_TIMEOUT_S)
            if piece is None:
                break
            body += piece[1]
    record.e2e_ms = (time.monotonic_ns() - t0) / 1e6
    headers = dict(stream.headers)
    http_status = stream.status
    record.error = server_error_message(body, http_status)
    if http_status == 200:
        return
    if http_status in _RATE_LIMIT_STATUSES:
        record.status = STATUS_RATE_LIMITED
        record.retry_after_s = parse_retry_after(headers.get("retry-after"))
        if record.retry_after_s is not None:
            record.error = f"{record.error} (Retry-After: {record.retry_after_s:g} s)"
        return
    record.status = STATUS_HTTP_ERROR
    if http_status in _REDIRECT_STATUSES:
        location = headers.get("location") or "no Location header"
        record.error = (
            f"HTTP {http_status} redirect to {location}: itlaudit does not follow redirects, "
            "so give the final URL as --url or the variant's url"
        )


async def _read_stream(
    stream: Stream, record: RequestRecord, t0: int, is_chat: bool, timeouts: Timeouts
) -> None:
    """The hot loop: read, stamp, frame, decode the kept fields, append. Chunk arrays are appended
    through local bound methods; whatever ends the stream (its end, a timeout, a dropped connection),
    the `finally` leaves a record with everything received up to that point.
    """
    feed = SSEFramer().feed
    read = stream.read
    chunks = record.chunks
    append_t_ms = chunks.t_ms.append
    append_tokens = chunks.completion_tokens.append
    append_text_len = chunks.text_len.append
    append_has_choice = chunks.has_choice.append
    append_token_ids = chunks.token_ids.append
    text_parts: list[str] = []
    append_text = text_parts.append
    last_ns = t0
    next_wait = timeouts.next_wait
    monotonic_ns = time.monotonic_ns
    try:
        while True:
            wait_s, limit = next_wait(t0, monotonic_ns(), bool(chunks.t_ms))
            try:
                got = await read(wait_s)
            except TimeoutError:
                _timed_out(record, limit, timeouts.limit(limit), t0, monotonic_ns(), last_ns)
                return
            if got is None:
                break
            last_ns, data = got
            payloads = feed(data)
            if not payloads:
                continue
            t_ms = (last_ns - t0) / 1e6
            for payload in payloads:
                if payload == _DONE:
                    record.done_sentinel = True
                    continue
                try:
                    chunk = decode_chunk(payload)
                except CHUNK_DECODE_ERRORS as exc:
                    chunk = _undecodable(record, payload, exc)
                    if chunk is None:
                        continue
                if chunk.error is not None:
                    record.status = STATUS_STREAM_ERROR
                    record.error = _error_frame_message(chunk.error)
                    continue
                usage = chunk.usage
                completion_tokens = None
                if usage is not None:
                    completion_tokens = usage.completion_tokens
                    record.completion_tokens = completion_tokens
                    record.prompt_tokens = usage.prompt_tokens
                choices = chunk.choices
                text = None
                token_ids = None
                if choices:
                    choice = choices[0]
                    if is_chat:
                        delta = choice.delta
                        text = delta.content if delta is not None else None
                    else:
                        text = choice.text
                    token_ids = choice.token_ids
                    if choice.finish_reason is not None:
                        record.finish_reason = choice.finish_reason
                        record.stop_reason = choice.stop_reason
                append_t_ms(t_ms)
                append_tokens(completion_tokens)
                append_has_choice(bool(choices))
                append_token_ids(token_ids)
                if text:
                    append_text_len(len(text))
                    append_text(text)
                else:
                    append_text_len(0)
                if record.response_id is None:
                    record.response_id = chunk.id
                if chunk.system_fingerprint is not None:
                    record.system_fingerprint = chunk.system_fingerprint
        record.e2e_ms = (last_ns - t0) / 1e6
    except _CONNECTION_FAILURES as exc:
        record.status = STATUS_CONNECTION_ERROR
        record.error = _describe_connection_failure(exc)
        record.e2e_ms = (last_ns - t0) / 1e6
    finally:
        record.text = "".join(text_parts)


def _undecodable(record: RequestRecord, payload: bytes, exc: Exception) -> Chunk | None:
    """A data event the decoder refused. Invalid UTF-8 is kept (decoded with U+FFFD, counted for the
    `invalid_utf8` finding); anything else ends up as a stream error with an excerpt, and reading
    goes on so later chunks and [DONE] are still seen."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        record.invalid_utf8_chunks += 1
        try:
            return decode_chunk(payload.decode("utf-8", "replace").encode())
        except CHUNK_DECODE_ERRORS as again:
            exc = again
    excerpt = payload[:_EXCERPT_BYTES].decode("utf-8", "replace")
    record.status = STATUS_STREAM_ERROR
    if payload[:1] in (b"{", b"["):
        record.error = f"server sent a chunk of an unexpected shape ({exc}): {excerpt!r}"
    else:
        record.error = f"server sent a data event that is not JSON: {excerpt!r}"
    return None


def _timed_out(
    record: RequestRecord, limit: str, seconds: float | None, t0: int, now: int, last_ns: int | None = None
) -> None:
    """The request was cut by one of the workload's timeouts: e2e is the real elapsed time, and the
    error says how long the silence was and after how much."""
    record.status = STATUS_TIMEOUT
    record.timeout_limit = limit
    record.e2e_ms = (now - t0) / 1e6
    silent_ms = (now - (last_ns if last_ns is not None else t0)) / 1e6
    received = len(record.chunks)
    record.error = (
        f"cut by {limit} = {seconds:g} s: nothing arrived for {silent_ms / 1000:.3g} s "
        f"after {received} chunk{'s' if received != 1 else ''}"
    )


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After is either delay-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


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


def _describe_connection_failure(exc: BaseException, timeout_s: float | None = None) -> str:
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
