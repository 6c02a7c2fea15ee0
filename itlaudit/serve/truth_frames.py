"""The truth server's responses, encoded ahead: one template per request shape, spliced per request."""

from __future__ import annotations

import codecs
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from itlaudit.serve.sim.endpoints import CompletionApi
from itlaudit.serve.sim.engine import Job, Step
from itlaudit.serve.sim.vocab import FIRST_REGULAR_TOKEN_ID, avoid_token, token_bytes
from itlaudit.serve.sim.wire import DONE_FRAME, ResponseContext, chunk_envelope, sse_frame, usage_info

__all__ = ["ScheduledStream", "Template", "build_template"]

if TYPE_CHECKING:
    from itlaudit.serve.truth import TruthConfig
    from itlaudit.serve.truth_http import Connection


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
