"""vLLM 0.32's wire format: chunk envelopes, usage blocks, logprobs, error bodies, SSE frames, the model card.

Field names and order are vLLM's (pydantic ``exclude_unset``: explicitly passed ``None`` values appear
as ``null``, unset ones are absent); real captures in ``tests/fixtures/`` are the reference.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from itlaudit.errors import SimError
from itlaudit.model.jsonvalue import JSONObject, JSONValue, ReadOnlyJSON
from itlaudit.model.run_context import SIMULATOR
from itlaudit.serve.sim.config import SimConfig
from itlaudit.serve.sim.engine import Job, TokenLogprob

# Raised by vLLM's AsyncLLM when the engine core process dies; the serving layer turns it into the
# streaming error frame (vllm/v1/engine/exceptions.py, EngineDeadError).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def error_body(message: str, err_type: str, param: str | None, status: int) -> JSONObject:
    return {"error": {"message": message, "type": err_type, "param": param, "code": int(status)}}


def rejection_body(exc: SimError) -> JSONObject:
    """The ``{"error": ...}`` body vLLM answers a refused request with."""
    return error_body(str(exc), exc.err_type, exc.param, exc.status)


def bad_request(message: str, param: str) -> SimError:
    return SimError(HTTPStatus.BAD_REQUEST, "BadRequestError", message, param)


def dump_json(obj: ReadOnlyJSON) -> str:
    """pydantic's ``model_dump_json`` layout: compact separators, raw UTF-8."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def usage_info(prompt_tokens: int, completion_tokens: int) -> JSONObject:
    """UsageInfo's field order, which puts total_tokens before completion_tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_usage_info(prompt_tokens: int, completion_tokens: int) -> JSONObject:
    """Non-streaming responses use plain ``model_dump()``, so unset optional fields appear as null."""
    return {
        **usage_info(prompt_tokens, completion_tokens),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


@dataclass
class ResponseContext:
    """Per-request identity shared by every chunk of one response."""

    request_id: str
    created: int
    model: str
    fingerprint: str
    job: Job
    prompt_logprobs: list[JSONValue] | None = None  # vLLM's layout, when asked (Engine.prompt_logprobs)


def completion_logprobs(entries: list[TokenLogprob]) -> JSONObject:
    """CompletionLogProbs; text_offset counts the rendered token strings, so with
    return_tokens_as_token_ids it advances by len("token_id:N"), as real vLLM 0.32 does."""
    offsets: list[JSONValue] = []
    offset = 0
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [e.logprob for e in entries],
        "tokens": [e.token for e in entries],
        "top_logprobs": [{**e.top} for e in entries],
    }


def chunk_envelope(
    ctx: ResponseContext,
    obj: str,
    choices: Sequence[JSONObject],
    usage: JSONObject | None = None,
    fingerprint: str | None = None,
    **tail: JSONValue,
) -> JSONObject:
    """A stream chunk with only the keys vLLM sets explicitly, in its model's field order."""
    chunk: JSONObject = {"id": ctx.request_id, "object": obj, "created": ctx.created, "model": ctx.model}
    chunk["choices"] = [*choices]
    if usage is not None:
        chunk["usage"] = usage
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    chunk.update(tail)
    return chunk


def sse_frame(obj: ReadOnlyJSON) -> bytes:
    return f"data: {dump_json(obj)}\n\n".encode()


# Streaming errors go through json.dumps(...model_dump()) with default separators, unlike the chunks.
ENGINE_DEAD_FRAME = (
    "data: "
    + json.dumps(
        error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, HTTPStatus.INTERNAL_SERVER_ERROR)
    )
    + "\n\n"
).encode()
DONE_FRAME = b"data: [DONE]\n\n"


def model_list(cfg: SimConfig) -> JSONObject:
    """The /v1/models body; shared with the ground-truth server so both serve vLLM's exact card."""
    created = int(time.time())
    permission: JSONObject = {
        "id": f"modelperm-{uuid.uuid4().int & (2**64 - 1):016x}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card: JSONObject = {
        "id": cfg.model,
        "object": "model",
        "created": created,
        "owned_by": SIMULATOR,  # vLLM says "vllm": the simulator says what it is
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
