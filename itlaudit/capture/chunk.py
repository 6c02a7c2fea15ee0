"""Decoding of one streamed completion chunk: only the fields a record keeps, typed, in one C call.

msgspec decodes straight from the SSE payload bytes into these structs and skips every other key
without building it; measured on vLLM-shaped chunks it is several times faster than orjson and json,
which build the whole object first (`python benchmarks/chunk_decode.py` prints the figures). The
types are the validation: a chunk whose `choices` is a list of lists or whose `completion_tokens` is a
string fails to decode, and the client records that as a stream error with an excerpt instead of
crashing on it later.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "CHUNK_DECODE_ERRORS",
    "Choice",
    "Chunk",
    "Delta",
    "Metrics",
    "Usage",
    "UsageDetails",
    "decode_chunk",
]


class UsageDetails(msgspec.Struct, gc=False):
    """usage.completion_tokens_details: how many of the completion tokens were the reasoning channel's
    (vLLM 0.32 with a reasoning parser, on chat)."""

    reasoning_tokens: int | None = None


class Usage(msgspec.Struct, gc=False):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens_details: UsageDetails | None = None


class Delta(msgspec.Struct, gc=False):
    """A chat chunk's delta: the answer (`content`) and the thinking (`reasoning`, vLLM 0.32 with a
    reasoning parser; `reasoning_content`, older vLLM and other servers)."""

    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class Choice(msgspec.Struct, gc=False):
    """/v1/completions carries `text`, /v1/chat/completions `delta.content`; one struct reads both.
    `index` is kept because a server that answers n > 1 anyway interleaves its replies' chunks, each
    marked only by this index: one int compared per chunk is all the reader spends on noticing that."""

    index: int = 0
    text: str | None = None
    delta: Delta | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class Metrics(msgspec.Struct, gc=False):
    """vLLM's per-request `metrics`, on the final usage chunk only: just its spec-decode block, kept
    as sent (its shape is marked experimental upstream). Chunks without the key cost nothing."""

    speculative_decoding: dict[str, Any] | None = None


class Chunk(msgspec.Struct, gc=False):
    id: str | None = None
    choices: list[Choice] | None = None
    usage: Usage | None = None
    metrics: Metrics | None = None
    system_fingerprint: str | None = None
    error: Any = None  # vLLM's mid-stream `{"error": {"message": ...}}`; other servers send a string


CHUNK_DECODE_ERRORS = (msgspec.DecodeError,)  # msgspec.ValidationError is a DecodeError
decode_chunk = msgspec.json.Decoder(Chunk).decode
