"""Decoding of one streamed completion chunk: only the fields a record keeps, typed, in one C call.

SGLang's native /generate stream has its own layout; `GenerateDecoder` reads it into the same `Chunk`,
so the read loop keeps one shape whatever the endpoint (and vLLM's chunks pay nothing for it).

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
    matched_stop: int | str | None = None  # SGLang's name for it (the stop token or string matched)


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


class _MetaInfo(msgspec.Struct, gc=False):
    """SGLang's `meta_info` (python/sglang/srt/managers/tokenizer_manager.py, `_handle_batch_output`):
    the cumulative `completion_tokens` on every chunk; `finish_reason` on the last, a dict
    (`{"type": "length", "length": N}`, `{"type": "stop", "matched": id or text}`, `{"type": "abort",
    "message": ...}`: schedule_batch.py's `to_json`); with speculative decoding, the request's
    acceptance on the last (`_calculate_spec_decoding_metrics`: `spec_verify_ct`, `spec_accept_length`
    = completion_tokens / spec_verify_ct, `spec_accept_rate`, and the accepted and proposed drafts as
    `spec_accept_token_num` / `spec_draft_token_num`, or `spec_accepted_drafts` / `spec_proposed_drafts`
    in later builds)."""

    id: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: Any = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    spec_accept_token_num: int | None = None
    spec_draft_token_num: int | None = None
    spec_accepted_drafts: int | None = None
    spec_proposed_drafts: int | None = None


class _GenerateChunk(msgspec.Struct, gc=False):
    text: str | None = None
    # left as sent: a cumulative list is read only from the ids new to this chunk (GenerateDecoder)
    output_ids: msgspec.Raw = msgspec.Raw()
    meta_info: _MetaInfo | None = None
    error: Any = None  # `{"error": {"message": ...}}`, as http_server.py's generate_request sends it


_decode_generate = msgspec.json.Decoder(_GenerateChunk).decode
_decode_ids = msgspec.json.Decoder(list[int]).decode
_SPEC_KEYS = tuple(name for name in _MetaInfo.__struct_fields__ if name.startswith("spec_"))


class GenerateDecoder:
    """One /generate stream's events as the `Chunk` the read loop keeps. SGLang sends the whole text
    and `output_ids` so far in every chunk (what its bench_serving reads: `generated_text =
    data["text"]`), or, with `--incremental-streaming-output`, only the new piece of each
    (tokenizer_manager.py `_handle_batch_output`; pieces queued behind a slow reader are joined,
    `_coalesce_streaming_chunks`). The chunk's new ids go where a vLLM stream's `token_ids` go, so the
    lossless audit compares SGLang's outputs by token and the distribution audit can score them.

    Which of the two a stream is, the ids say exactly and at once: `meta_info.completion_tokens` is
    the count sent so far, so an incremental chunk's ids plus those already received add up to it,
    while a cumulative list alone is that long (or longer: a still-running request's list is sent by
    reference and may have grown). A cumulative list is counted by its commas and only its new tail is
    decoded: building every id of it again on every chunk would cost a 500-token stream about twice
    the decoding, growing with the output. A chunk without a count keeps no ids (the record then
    compares by text). Without ids the text decides: one that does not extend the text before is a
    piece from then on. The chunk's tokens are the rise of `completion_tokens`, kept as usage; the
    finish reason as its `type`, the matched stop as `stop_reason`, an abort as an error frame; the
    last chunk's `spec_*` keys, as sent, as the request's acceptance."""

    __slots__ = ("_ids", "_incremental", "_text")

    def __init__(self) -> None:
        self._text = ""
        self._ids = 0  # output ids received so far
        self._incremental = False

    def decode(self, payload: bytes) -> Chunk:
        native = _decode_generate(payload)
        meta = native.meta_info
        if meta is None:
            return Chunk(error=native.error)
        reason = meta.finish_reason
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "abort":
            message = reason.get("message") if isinstance(reason, dict) else None
            return Chunk(id=meta.id, error={"message": f"SGLang aborted the request: {message}"})
        total = meta.completion_tokens
        ids = (
            self._new_ids(bytes(native.output_ids), total)
            if native.output_ids and total is not None
            else None
        )
        text = native.text
        if text is not None and not self._incremental:
            if text.startswith(self._text):
                text, self._text = text[len(self._text) :], text
            else:
                self._incremental = True
        choice = Choice(
            text=text,
            token_ids=ids,
            finish_reason=None if kind is None else str(kind),
            stop_reason=reason.get("matched") if isinstance(reason, dict) else None,
        )
        usage = Usage(completion_tokens=total, prompt_tokens=meta.prompt_tokens)
        spec = {key: value for key in _SPEC_KEYS if (value := getattr(meta, key)) is not None}
        metrics = Metrics(speculative_decoding=spec) if spec else None
        return Chunk(id=meta.id, choices=[choice], usage=usage, metrics=metrics, error=native.error)

    def _new_ids(self, sent: bytes, total: int) -> list[int] | None:
        """The ids of `sent` (a JSON list, or null) new to this chunk, given the count sent so far."""
        if sent == b"null":
            return None
        seen = self._ids
        commas = sent.count(b",")
        whole = _decode_ids(sent) if not commas or not seen else None  # short, or the first: all read
        count = commas + 1 if whole is None else len(whole)
        if not seen:
            ids = whole or []
        elif count + seen == total:  # a piece: with those received, as many as were sent
            self._incremental = True
            ids = _decode_ids(sent) if whole is None else whole
        elif whole is not None:  # the list so far, short
            ids = whole[seen:]
        else:  # the list so far: only the ids past the ones received are decoded
            cut = len(sent)
            for _ in range(count - seen):
                cut = sent.rfind(b",", 0, cut)
            ids = _decode_ids(b"[" + sent[cut + 1 :]) if count > seen else []
        self._ids += len(ids)
        return ids
