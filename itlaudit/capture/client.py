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
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from itlaudit.capture.chunk import CHUNK_DECODE_ERRORS, Chunk, GenerateDecoder, decode_chunk
from itlaudit.capture.http1 import DECODED_CODINGS, Stream
from itlaudit.capture.request_plan import PlannedRequest
from itlaudit.capture.sse import SSEFramer
from itlaudit.capture.transport import TransportOptions, open_stream
from itlaudit.errors import ConnectTimeout, EventTooLarge, TransportError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.records import (
    DURATION_CUT,
    RequestRecord,
    Status,
    Timeouts,
)
from itlaudit.model.vocabulary import DEFAULT_STAMP, Endpoint, StampMode
from itlaudit.side.client import describe_connection_failure, server_error_message

if TYPE_CHECKING:
    from collections.abc import Callable

    from itlaudit.capture.lagprobe import LagProbe

# What the h11 transport raises when the network or the server goes away mid-request, as opposed to
# a bug here: its own errors, the OS's, and a read that ran out of time.
_STREAM_FAILURES = (TransportError, TimeoutError, OSError)
_DONE = b"[DONE]"
_EXCERPT_BYTES = 120
_EVENT_STREAM = "text/event-stream"
_RATE_LIMIT_STATUSES = (429, 503)
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_REFUSAL_BODY_LIMIT = 64 * 1024
_REFUSAL_READ_TIMEOUT_S = 10.0
DEFAULT_TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class StreamOptions:
    """How every request of a worker's share is sent, as one object: its limits, how its chunks are
    stamped and what it carries (headers, TLS). A share holds one (capture/workers.split_shares) and
    travels with it to its process or Ray actor; there its transport options and header map are made
    once, on first use, instead of once a request. `stamp` "kernel" falls back to "loop" where the
    platform has no kernel receive timestamps; `record.stamp` says which ran."""

    timeouts: Timeouts = DEFAULT_TIMEOUTS
    stamp: StampMode = DEFAULT_STAMP
    access: Access = NO_ACCESS

    @functools.cached_property
    def transport(self) -> TransportOptions:
        """Built where the streams run: an SSL context does not pickle, so it is never in the share."""
        return TransportOptions(
            stamp=self.stamp,
            connect_timeout_s=self.timeouts.connect_timeout_s,
            ssl_context=self.access.ssl_context(),
        )

    @functools.cached_property
    def headers(self) -> dict[str, str]:
        return self.access.header_map()

    def __getstate__(self) -> dict[str, object]:
        """The fields alone: what was made from them is made again where the share lands."""
        return {"timeouts": self.timeouts, "stamp": self.stamp, "access": self.access}


DEFAULT_STREAM = StreamOptions()


async def stream_request(
    plan: PlannedRequest, options: StreamOptions = DEFAULT_STREAM, probe: LagProbe | None = None
) -> RequestRecord:
    """Send one streaming request and return its raw record; network and server failures are
    recorded in `status`/`error`, never raised.

    `t0` is the transport's stamp just before the request bytes were written, so TTFT covers
    connecting and the server's queueing but not our own work. Records assume n=1 (the scenario
    rejects n > 1): text, token ids and finish_reason come from choices[0], and a server that
    interleaves other indices anyway makes the record a stream error (`other_index_chunks`). With a
    lag probe, the record names the probe samples taken while the stream was open; the writer thread
    turns them into the record's loop-lag figures.
    """
    record = plan.new_record()
    timeouts = options.timeouts
    record.started_at_unix = time.time()
    t0 = time.monotonic_ns()
    record.sent_monotonic_ns = t0
    head_wait_s, head_limit = timeouts.next_wait(t0, t0, False)
    try:
        async with asyncio.timeout(head_wait_s):  # the transport does not time the wait for the head
            stream = await open_stream(plan.url, plan.payload, options.headers, options.transport)
    except ConnectTimeout:
        _timed_out(record, "connect_timeout_s", timeouts.connect_timeout_s, t0, time.monotonic_ns())
        return _closed(record, probe)
    except TimeoutError:
        _timed_out(record, head_limit, timeouts.limit(head_limit), t0, time.monotonic_ns())
        return _closed(record, probe)
    except _STREAM_FAILURES as exc:
        record.status = Status.CONNECTION_ERROR
        record.error = describe_connection_failure(exc)
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
            record.status = Status.STREAM_ERROR
            record.error = (
                f"HTTP 200 with content type {shown}, not {_EVENT_STREAM}: the server did not stream "
                f"({record.error}); check that it supports stream=true"
            )
        elif stream.content_encoding and stream.content_encoding not in DECODED_CODINGS:
            record.status = Status.STREAM_ERROR
            record.e2e_ms = (time.monotonic_ns() - t0) / 1e6
            record.error = (
                f"the server compressed the event stream with Content-Encoding {stream.content_encoding} "
                f"although the request asked for identity; itlaudit decodes only "
                f"{', '.join(DECODED_CODINGS)}: turn the compression off for this endpoint"
            )
        else:
            # SGLang's /generate has its own layout, read into the same chunks; vLLM's pay nothing for it
            decode = GenerateDecoder().decode if plan.endpoint == Endpoint.GENERATE else decode_chunk
            await _read_stream(stream, record, t0, plan.endpoint == Endpoint.CHAT, timeouts, decode)
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
    with contextlib.suppress(TimeoutError, *_STREAM_FAILURES):
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
        record.status = Status.RATE_LIMITED
        record.retry_after_s = parse_retry_after(headers.get("retry-after"))
        if record.retry_after_s is not None:
            record.error = f"{record.error} (Retry-After: {record.retry_after_s:g} s)"
        return
    record.status = Status.HTTP_ERROR
    if http_status in _REDIRECT_STATUSES:
        location = headers.get("location") or "no Location header"
        record.error = (
            f"HTTP {http_status} redirect to {location}: itlaudit does not follow redirects, "
            "so give the final URL as --url or the variant's url"
        )


async def _read_stream(
    stream: Stream,
    record: RequestRecord,
    t0: int,
    is_chat: bool,
    timeouts: Timeouts,
    decode: Callable[[bytes], Chunk] = decode_chunk,
) -> None:
    """The hot loop: read, stamp, frame, decode the kept fields, append. Chunk arrays are appended
    through local bound methods; whatever ends the stream (its end, a timeout, a dropped connection,
    an event past the framer's size limit), the `finally` leaves a record with everything received up
    to that point.
    """
    feed = SSEFramer().feed
    read = stream.read
    chunks = record.chunks
    append_t_ms = chunks.t_ms.append
    append_tokens = chunks.completion_tokens.append
    append_text_len = chunks.text_len.append
    append_has_choice = chunks.has_choice.append
    append_token_ids = chunks.token_ids.append
    append_reasoning_len = chunks.reasoning_len.append
    text_parts: list[str] = []
    append_text = text_parts.append
    reasoning_parts: list[str] = []
    append_reasoning = reasoning_parts.append
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
                    chunk = decode(payload)
                except CHUNK_DECODE_ERRORS as exc:
                    recovered = _undecodable(record, payload, exc, decode)
                    if recovered is None:
                        continue
                    chunk = recovered
                if chunk.error is not None:
                    record.status = Status.STREAM_ERROR
                    record.error = _error_frame_message(chunk.error)
                    continue
                usage = chunk.usage
                completion_tokens = None
                if usage is not None:
                    completion_tokens = usage.completion_tokens
                    record.completion_tokens = completion_tokens
                    record.prompt_tokens = usage.prompt_tokens
                    if usage.completion_tokens_details is not None:
                        record.reasoning_tokens = usage.completion_tokens_details.reasoning_tokens
                    if chunk.metrics is not None:  # rides on the usage chunk: no cost on the others
                        record.spec_decode = chunk.metrics.speculative_decoding
                choices = chunk.choices
                text = None
                reasoning = None
                token_ids = None
                if choices:
                    choice = choices[0]
                    if choice.index or len(choices) > 1:  # replies interleaved: only index 0 is kept
                        record.other_index_chunks += 1
                        if choice.index:
                            continue
                    if is_chat:
                        delta = choice.delta
                        if delta is not None:
                            text = delta.content
                            reasoning = delta.reasoning or delta.reasoning_content
                    else:
                        text = choice.text
                    token_ids = choice.token_ids
                    if choice.finish_reason is not None:
                        record.finish_reason = choice.finish_reason
                        record.stop_reason = choice.stop_reason
                        if record.stop_reason is None:  # SGLang's OpenAI streams: matched_stop
                            record.stop_reason = choice.matched_stop
                append_t_ms(t_ms)
                append_tokens(completion_tokens)
                append_has_choice(bool(choices))
                append_token_ids(token_ids)
                if text:
                    append_text_len(len(text))
                    append_text(text)
                else:
                    append_text_len(0)
                if reasoning:  # a thinking model's chunk: the lengths start here, zeros before
                    if not reasoning_parts:
                        chunks.reasoning_len.extend([0] * (len(chunks.t_ms) - 1))
                    append_reasoning_len(len(reasoning))
                    append_reasoning(reasoning)
                elif reasoning_parts:
                    append_reasoning_len(0)
                if record.response_id is None:
                    record.response_id = chunk.id
                if chunk.system_fingerprint is not None:
                    record.system_fingerprint = chunk.system_fingerprint
        record.e2e_ms = (last_ns - t0) / 1e6
    except _STREAM_FAILURES as exc:
        record.status = Status.CONNECTION_ERROR
        record.error = describe_connection_failure(exc)
        record.e2e_ms = (last_ns - t0) / 1e6
    except EventTooLarge as exc:  # an endless line: cut there, what came before it is the record's
        record.status = Status.STREAM_ERROR
        record.error = f"{exc}: the stream was cut there, the {len(chunks)} chunks before it are kept"
        record.e2e_ms = (last_ns - t0) / 1e6
    finally:
        record.text = "".join(text_parts)
        record.reasoning = "".join(reasoning_parts)
        if record.other_index_chunks and record.status == Status.OK:
            record.status = Status.STREAM_ERROR
            record.error = (
                f"the server interleaved several replies ({record.other_index_chunks} chunks with a "
                "choices[].index other than 0, as n > 1 streams them): not one reply, so not measured; "
                "index 0's text is kept"
            )


def _undecodable(
    record: RequestRecord, payload: bytes, exc: Exception, decode: Callable[[bytes], Chunk]
) -> Chunk | None:
    """A data event the decoder refused. Invalid UTF-8 is kept (decoded with U+FFFD, counted for the
    `invalid_utf8` finding); anything else ends up as a stream error with an excerpt, and reading
    goes on so later chunks and [DONE] are still seen."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        record.invalid_utf8_chunks += 1
        try:
            return decode(payload.decode("utf-8", "replace").encode())
        except CHUNK_DECODE_ERRORS as again:
            exc = again
    excerpt = payload[:_EXCERPT_BYTES].decode("utf-8", "replace")
    record.status = Status.STREAM_ERROR
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
    record.status = Status.TIMEOUT
    record.timeout_limit = limit
    record.e2e_ms = (now - t0) / 1e6
    silent_ms = (now - (last_ns if last_ns is not None else t0)) / 1e6
    received = len(record.chunks)
    chunks = f"{received} chunk{'s' if received != 1 else ''}"
    if limit == DURATION_CUT:  # the run's end, not the server's silence
        record.error = (
            f"cut at the run's end ({seconds:g} s after its start: duration_s and its grace) after {chunks}"
        )
        return
    record.error = (
        f"cut by {limit} = {seconds:g} s: nothing arrived for {silent_ms / 1000:.3g} s after {chunks}"
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
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    return str(error)
