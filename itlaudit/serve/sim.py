"""A vLLM-compatible simulator server: the demo target and the fault-injection target.

The auditor's claims (token-true ITL under speculative decoding, truncation findings) are only as good
as its parsing of real vLLM streams, so the simulator speaks vLLM 0.32's wire format field for field:
the same key names and key order (vLLM serialises pydantic models with ``exclude_unset``, so explicitly
passed ``None`` values appear as ``null`` and unset ones are absent), one SSE chunk per engine step, the
chat role chunk, the trailing usage-only chunk, the mid-stream error frame and the HTTP error bodies.
The layouts below were read from vLLM 0.32's ``entrypoints/openai`` and checked against real captures
in ``tests/fixtures/``.

Faults are injected server-side so that every finding the auditor can raise has a reproducible cause.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import random
import re
import time
import uuid
import zlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from itlaudit.model.sendlog import SendLog

VLLM_VERSION = "0.32.0"

# Raised by vLLM's AsyncLLM when the engine core process dies; the serving layer turns it into the
# streaming error frame (vllm/v1/engine/exceptions.py, EngineDeadError).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."

# vLLM's default --max-logprobs.
MAX_LOGPROBS = 20

UNK_TOKEN_ID = 0
BOS_TOKEN_ID = 1
FIRST_REGULAR_TOKEN_ID = 3

# Byte pieces of the built-in vocabulary. Like a byte-level BPE vocabulary it contains pieces that
# split a multi-byte UTF-8 character (the euro sign and an emoji below), so an incremental detokenizer
# must hold bytes back and a chunk can carry tokens but no text, exactly as real vLLM streams do.
# Few digits, so clean simulated output reads as prose to the gibberish rule (digit_ratio ~0.01).
_PIECES: tuple[bytes, ...] = (
    b" the",
    b" model",
    b" token",
    b"s",
    b" of",
    b" and",
    b"ing",
    b" to",
    b" a",
    b" in",
    b" decode",
    b" draft",
    b",",
    b".",
    b"\n",
    b" 1",
    b" step",
    b" chunk",
    b" is",
    b"ed",
    "é".encode(),
    " über".encode(),
    "—".encode(),
    "中".encode(),
    b"\xe2\x82",  # first two bytes of "€"
    b"\xac",  # last byte of "€"
    b"\xf0\x9f",  # first half of "🙂"
    b"\x99\x82",  # second half of "🙂"
)


DIGIT_TOKEN_ID = FIRST_REGULAR_TOKEN_ID + _PIECES.index(b" 1")


@dataclass
class SimConfig:
    """Server behaviour and injected faults; all faults are off by default."""

    model: str = "sim-tiny"
    num_speculative_tokens: int = 0
    acceptance_prob: float = 1.0
    step_ms: float = 5.0
    ttft_ms: float = 20.0
    seed: int = 0
    eos_token_id: int = 2
    vocab_size: int = 512
    max_model_len: int = 2048
    default_max_tokens: int | None = None
    # Injected faults.
    cap_tokens: int | None = None
    ignore_stop_token_ids: bool = False
    ignore_ignore_eos: bool = False
    ignore_min_tokens: bool = False
    drop_usage: bool = False
    error_after_tokens: int | None = None
    reset_after_tokens: int | None = None
    no_done: bool = False
    natural_eos_at: int | None = None
    # Fault: from this token position on, emit only a digit piece, like the late numeric gibberish of
    # a broken decode path (seed 003) — the stream itself stays well-formed.
    gibberish_after_tokens: int | None = None
    # Fault: a request's logprobs move by up to this much (nats) whenever another row shares its engine
    # step (a multi-prompt list or a concurrent request), deterministically per step composition, like
    # the batch variance of real kernels (seed 000). The sampled tokens do not change.
    batch_variance: float = 0.0
    # Load: each engine row beyond the first adds this much to every step (a batch is not free), and
    # with spec decode on, this much more (verifying a row's drafts costs compute). Past the batch size
    # where K extra verify rows cost more than the accepted drafts save, K>0 loses per token to K=0:
    # what `itlaudit sweep` must find. Both 0 by default: a step takes step_ms at any concurrency.
    batch_slowdown_ms_per_stream: float = 0.0
    spec_verify_ms_per_stream: float = 0.0

    @property
    def system_fingerprint(self) -> str:
        """Stable per configuration, shaped like vLLM's ``vllm-<version>-<hash8>``."""
        return f"vllm-{VLLM_VERSION}-{zlib.crc32(repr(self).encode()):08x}"


def token_bytes(token_id: int, config: SimConfig) -> bytes:
    """Special tokens decode to nothing, as with ``skip_special_tokens``."""
    if token_id < FIRST_REGULAR_TOKEN_ID or token_id == config.eos_token_id:
        return b""
    return _PIECES[(token_id - FIRST_REGULAR_TOKEN_ID) % len(_PIECES)]


def tokenize(text: str, config: SimConfig) -> list[int]:
    """Word-level hashing: stable across runs, so prompt_token_ids are reproducible."""
    span = config.vocab_size - FIRST_REGULAR_TOKEN_ID
    ids = [FIRST_REGULAR_TOKEN_ID + zlib.crc32(w.encode()) % span for w in re.findall(r"\s*\S+", text)]
    return [_avoid(i, {config.eos_token_id}, config) for i in ids] or [BOS_TOKEN_ID]


def _avoid(token_id: int, banned: set[int], config: SimConfig) -> int:
    """Deterministic substitute for a masked token (the min_tokens logits processor, or EOS in a
    prompt) that consumes no randomness, so the rest of the sequence is unchanged."""
    span = config.vocab_size - FIRST_REGULAR_TOKEN_ID
    while token_id in banned:
        token_id = FIRST_REGULAR_TOKEN_ID + (token_id - FIRST_REGULAR_TOKEN_ID + 1) % span
    return token_id


class SimError(Exception):
    """A request rejected before streaming starts; rendered as vLLM's ``{"error": ...}`` body."""

    def __init__(self, status: HTTPStatus, err_type: str, message: str, param: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return _error_body(str(self), self.err_type, self.param, self.status)


def _error_body(message: str, err_type: str, param: str | None, status: HTTPStatus) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status.value}}


def _bad_request(message: str, param: str) -> SimError:
    return SimError(HTTPStatus.BAD_REQUEST, "BadRequestError", message, param)


@dataclass
class _Job:
    """The sampling parameters of one request, after vLLM-style defaulting and validation."""

    prompt_token_ids: list[int]
    prompt_text: str
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: frozenset[int]
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    return_prompt_text: bool
    logprobs: int | None = None
    return_tokens_as_token_ids: bool = False


@dataclass
class _TokenLogprob:
    """One sampled token's logprob entry, with token strings already rendered as the API shows them."""

    token: str
    logprob: float
    top: dict[str, float]


@dataclass
class _Step:
    """What one engine step hands to the serving layer: the tokens accepted in that step."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    stop_reason: int | None = None
    logprobs: list[_TokenLogprob] = field(default_factory=list)
    due_ns: int = 0  # when the schedule says this step's chunk leaves (CLOCK_MONOTONIC)


@dataclass
class _SpecDecodeCounters:
    """Cumulative over the server's life, like vLLM's Prometheus counters."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


async def _sleep_until(due_ns: int) -> None:
    await asyncio.sleep(max(0.0, (due_ns - time.monotonic_ns()) / 1e9))


class _Engine:
    """Token generation with rejection-sampling-shaped acceptance and vLLM's stop checks."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.started = time.time()
        self.rng = random.Random(config.seed)
        self.spec = _SpecDecodeCounters(accepted_per_pos=[0] * config.num_speculative_tokens)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0}
        self.in_flight = 0  # engine rows running now: what decides whether a step is shared

    def _request_seed(self, job: _Job) -> str:
        if job.seed is not None:
            return f"seed-{job.seed}"
        if job.temperature == 0:
            # Greedy: the output depends only on the prompt, as with a real model.
            return f"greedy-{self.config.seed}-{job.prompt_token_ids}"
        return f"random-{self.rng.getrandbits(64)}"

    async def generate(self, job: _Job) -> AsyncIterator[_Step]:
        cfg = self.config
        request_seed = self._request_seed(job)
        token_rng = random.Random(f"tokens-{request_seed}")
        accept_rng = random.Random(f"accept-{request_seed}")
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        eos_stops = not job.ignore_eos or cfg.ignore_ignore_eos
        stop_ids = frozenset() if cfg.ignore_stop_token_ids else job.stop_token_ids
        min_tokens = 0 if cfg.ignore_min_tokens else job.min_tokens
        eos = {cfg.eos_token_id}
        masked = eos | job.stop_token_ids  # what vLLM's min_tokens logits processor bans
        budget = job.max_tokens if cfg.cap_tokens is None else min(job.max_tokens, cfg.cap_tokens)
        self.prompt_tokens += len(job.prompt_token_ids)

        produced = 0
        # Steps are due at absolute times (prefill + n steps after arrival), so time spent writing and
        # waking up late does not accumulate: a "5 ms" server delivers one step per 5 ms on average.
        # After a stall (the process was starved) steps catch up at half a step apart, never in a
        # burst that would land the missed steps in one read.
        scheduled_ns = due_ns = time.monotonic_ns() + round(cfg.ttft_ms * 1e6)
        await _sleep_until(due_ns)
        while True:
            # The prefill step samples one token; each decode step verifies K drafts and accepts a
            # prefix of them plus one bonus token. As in vLLM the acceptance counters are recorded before
            # the step is cut at a stop token or at max_tokens (real K3 captures: 16 tokens in frames
            # 1,4,4,4,3 count 4 drafts, 12 draft tokens and 12 accepted).
            num_drafts = 0 if produced == 0 else cfg.num_speculative_tokens
            accepted = 0
            while accepted < num_drafts and accept_rng.random() < cfg.acceptance_prob:
                accepted += 1
            if num_drafts:
                self._observe_spec(num_drafts, accepted)

            step = _Step(token_ids=[], text="", due_ns=due_ns)
            for _ in range(accepted + 1):
                index = produced
                # One draw per position whatever happens to it, so EOS placement and masking leave
                # the rest of the sequence unchanged.
                drawn = _avoid(token_rng.randrange(FIRST_REGULAR_TOKEN_ID, cfg.vocab_size), eos, cfg)
                token_id = cfg.eos_token_id if index == cfg.natural_eos_at else drawn
                if cfg.gibberish_after_tokens is not None and index >= cfg.gibberish_after_tokens:
                    token_id = DIGIT_TOKEN_ID
                if index < min_tokens:
                    token_id = _avoid(token_id, masked, cfg)
                produced += 1
                step.token_ids.append(token_id)
                if job.logprobs is not None:
                    step.logprobs.append(
                        self._token_logprob(job, job.logprobs, f"{request_seed}-{index}", token_id)
                    )
                if token_id == cfg.eos_token_id and eos_stops:
                    step.finish_reason = "stop"
                elif token_id in stop_ids:
                    step.finish_reason, step.stop_reason = "stop", token_id
                else:
                    step.text += decoder.decode(token_bytes(token_id, cfg))
                    if produced >= budget:
                        step.finish_reason = "length"
                if step.finish_reason:
                    break
            self.generation_tokens += len(step.token_ids)
            if step.finish_reason:
                self.finished[step.finish_reason] += 1
            yield step
            if step.finish_reason:
                return
            step_ns = round(self._step_ms() * 1e6)
            scheduled_ns += step_ns
            due_ns = max(scheduled_ns, time.monotonic_ns() + step_ns // 2)
            await _sleep_until(due_ns)

    def _step_ms(self) -> float:
        """One decode step at the engine's current batch (the rows in flight now)."""
        cfg = self.config
        per_row = cfg.batch_slowdown_ms_per_stream
        if cfg.num_speculative_tokens:
            per_row += cfg.spec_verify_ms_per_stream
        return cfg.step_ms + per_row * max(self.in_flight - 1, 0)

    def _token_logprob(self, job: _Job, k: int, position_seed: str, token_id: int) -> _TokenLogprob:
        """Deterministic candidates ranked below the sampled token, so greedy output is the argmax.

        A few more candidates than requested are ranked, so that batch variance can also change which
        ids make the top-k cut, as it does on real servers.
        """
        cfg = self.config
        rng = random.Random(f"logprobs-{position_seed}")
        pool = rng.sample(range(FIRST_REGULAR_TOKEN_ID, cfg.vocab_size), k + 4)
        ranked = [token_id, *(t for t in pool if t != token_id)]
        values = {tok: -1.0 - 0.1 * rank for rank, tok in enumerate(ranked)}
        if cfg.batch_variance and self.in_flight > 1:
            jitter = random.Random(f"variance-{position_seed}-{self.in_flight}")
            values = {tok: v + cfg.batch_variance * jitter.uniform(-1, 1) for tok, v in values.items()}

        def render(tok: int) -> str:
            if job.return_tokens_as_token_ids:
                return f"token_id:{tok}"
            return token_bytes(tok, cfg).decode("utf-8", errors="replace")

        best = sorted(values, key=values.__getitem__, reverse=True)[:k]
        top = {render(tok): values[tok] for tok in best}
        top.setdefault(render(token_id), values[token_id])  # vLLM always includes the sampled token
        return _TokenLogprob(render(token_id), values[token_id], top)

    def _observe_spec(self, num_drafts: int, accepted: int) -> None:
        self.spec.num_drafts += 1
        self.spec.num_draft_tokens += num_drafts
        self.spec.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.spec.accepted_per_pos[pos] += 1


class _MetricsCollector(Collector):
    """Renders vLLM's /metrics names; labels sorted as in real vLLM's multiprocess output."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[CounterMetricFamily]:
        engine, cfg = self.engine, self.engine.config
        base = {"engine": "0", "model_name": cfg.model}

        def counter(name: str, doc: str, samples: list[tuple[dict[str, str], int]]) -> CounterMetricFamily:
            labels = sorted(samples[0][0])
            family = CounterMetricFamily(name, doc, labels=labels)
            for extra, value in samples:
                family.add_metric([extra[k] for k in labels], float(value), created=engine.started)
            return family

        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [(base, engine.prompt_tokens)]
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            [(base, engine.generation_tokens)],
        )
        yield counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [({**base, "finished_reason": r}, n) for r, n in engine.finished.items()],
        )
        if not cfg.num_speculative_tokens:
            return  # vLLM registers the spec-decode counters only when speculative decoding is on.
        spec = engine.spec
        yield counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(base, spec.num_drafts)]
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(base, spec.num_draft_tokens)]
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            [(base, spec.num_accepted_tokens)],
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [({**base, "position": str(pos)}, n) for pos, n in enumerate(spec.accepted_per_pos)],
        )


def _dumps(obj: Any) -> str:
    """pydantic's ``model_dump_json`` layout: compact separators, raw UTF-8."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """UsageInfo's field order, which puts total_tokens before completion_tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _full_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """Non-streaming responses use plain ``model_dump()``, so unset optional fields appear as null."""
    return {
        **_usage(prompt_tokens, completion_tokens),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        value = default  # vLLM treats an explicit null like an omitted field (normalize_null_max_tokens)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise _bad_request(f"{name} must be an integer", name)
    return value


@dataclass
class _Ctx:
    """Per-request identity shared by every chunk of one response."""

    request_id: str
    created: int
    model: str
    fingerprint: str
    job: _Job


class _Api(ABC):
    """What differs between /v1/completions and /v1/chat/completions; the streaming loop is shared."""

    id_prefix: str
    chunk_object: str
    full_object: str
    # /v1/completions defaults max_tokens to 16 (CompletionRequest); chat leaves it unset.
    default_max_tokens: int | None

    @abstractmethod
    def prompt(self, body: dict[str, Any], config: SimConfig) -> tuple[list[int], str]:
        """Prompt token ids and the prompt text (the rendered template, for chat)."""

    def max_tokens_param(self, body: dict[str, Any]) -> str:
        return "max_tokens"

    def rows(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The request body of each engine request this API request fans out into."""
        return [body]

    def chunk_usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return _usage(prompt_tokens, completion_tokens)

    def opening_chunks(self, ctx: _Ctx) -> list[dict[str, Any]]:
        return []

    @abstractmethod
    def stream_choice(self, ctx: _Ctx, step: _Step, first: bool) -> dict[str, Any]:
        """The single choice of a streamed chunk carrying one engine step."""

    @abstractmethod
    def full_choice(
        self, ctx: _Ctx, text: str, token_ids: list[int], last: _Step, logprobs: list[_TokenLogprob]
    ) -> dict[str, Any]:
        """The single choice of a non-streaming response."""

    def full_extra(self, ctx: _Ctx) -> dict[str, Any]:
        return {}


class _CompletionApi(_Api):
    id_prefix = "cmpl-"
    chunk_object = "text_completion"
    full_object = "text_completion"
    default_max_tokens = 16

    def prompt(self, body: dict[str, Any], config: SimConfig) -> tuple[list[int], str]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt), ""
        if isinstance(prompt, str):
            return tokenize(prompt, config), prompt
        raise _bad_request("the simulator accepts a string or a list of token ids per prompt", "prompt")

    def rows(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        # A list of strings is a batch: vLLM submits one engine request per prompt, all at once.
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [{**body, "prompt": p} for p in prompt]
        return [body]

    def stream_choice(self, ctx: _Ctx, step: _Step, first: bool) -> dict[str, Any]:
        job = ctx.job
        return {
            "index": 0,
            "text": step.text,
            "logprobs": None,
            "finish_reason": step.finish_reason,
            "stop_reason": step.stop_reason,
            "prompt_token_ids": job.prompt_token_ids if first and job.return_token_ids else None,
            "token_ids": step.token_ids if job.return_token_ids else None,
        }

    def full_choice(
        self, ctx: _Ctx, text: str, token_ids: list[int], last: _Step, logprobs: list[_TokenLogprob]
    ) -> dict[str, Any]:
        job = ctx.job
        return {
            "index": 0,
            "text": text,
            "logprobs": None if job.logprobs is None else _completion_logprobs(logprobs),
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
            "token_ids": token_ids if job.return_token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": job.prompt_token_ids if job.return_token_ids else None,
            "routed_experts": None,
        }


class _ChatApi(_Api):
    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"
    full_object = "chat.completion"
    default_max_tokens = None

    def prompt(self, body: dict[str, Any], config: SimConfig) -> tuple[list[int], str]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad_request("messages must be a non-empty list", "messages")
        rendered = "".join(
            f"<|{m.get('role')}|>\n{_message_text(m.get('content'))}<|end|>\n" for m in messages
        )
        rendered += "<|assistant|>\n"
        return tokenize(rendered, config), rendered

    def max_tokens_param(self, body: dict[str, Any]) -> str:
        return "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"

    def chunk_usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        # The chat server passes completion_tokens_details explicitly (None without a reasoning parser),
        # so it is serialised on every chunk except the exclude_none usage-only one.
        return {**_usage(prompt_tokens, completion_tokens), "completion_tokens_details": None}

    def opening_chunks(self, ctx: _Ctx) -> list[dict[str, Any]]:
        job = ctx.job
        return [
            _envelope(
                ctx,
                self.chunk_object,
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                usage=self.chunk_usage(len(job.prompt_token_ids), 0) if job.continuous_usage else None,
                prompt_token_ids=job.prompt_token_ids if job.return_token_ids else None,
                prompt_text=job.prompt_text if job.return_prompt_text else None,
            )
        ]

    def stream_choice(self, ctx: _Ctx, step: _Step, first: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": step.text},
            "logprobs": None,
            "finish_reason": step.finish_reason,
        }
        if step.finish_reason:
            # Only the terminal chunk passes stop_reason explicitly, so only it serialises the key.
            choice["stop_reason"] = step.stop_reason
        choice["token_ids"] = step.token_ids if ctx.job.return_token_ids else None
        return choice

    def full_choice(
        self, ctx: _Ctx, text: str, token_ids: list[int], last: _Step, logprobs: list[_TokenLogprob]
    ) -> dict[str, Any]:
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        return {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
            "token_ids": token_ids if ctx.job.return_token_ids else None,
            "routed_experts": None,
        }

    def full_extra(self, ctx: _Ctx) -> dict[str, Any]:
        job = ctx.job
        return {
            "prompt_logprobs": None,
            "prompt_token_ids": job.prompt_token_ids if job.return_token_ids else None,
            "prompt_text": job.prompt_text if job.return_prompt_text else None,
        }


def _completion_logprobs(entries: list[_TokenLogprob]) -> dict[str, Any]:
    """CompletionLogProbs; text_offset counts the rendered token strings, so with
    return_tokens_as_token_ids it advances by len("token_id:N"), as real vLLM 0.32 does."""
    offsets, offset = [], 0
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [e.logprob for e in entries],
        "tokens": [e.token for e in entries],
        "top_logprobs": [e.top for e in entries],
    }


def _message_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _envelope(
    ctx: _Ctx,
    obj: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    fingerprint: str | None = None,
    **tail: Any,
) -> dict[str, Any]:
    """A stream chunk with only the keys vLLM sets explicitly, in its model's field order."""
    chunk: dict[str, Any] = {"id": ctx.request_id, "object": obj, "created": ctx.created, "model": ctx.model}
    chunk["choices"] = choices
    if usage is not None:
        chunk["usage"] = usage
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    chunk.update(tail)
    return chunk


def _parse_job(api: _Api, body: dict[str, Any], config: SimConfig) -> _Job:
    """Mirrors vLLM's request validation and get_max_tokens() defaulting."""
    model = body.get("model")
    if model and model != config.model:
        raise SimError(
            HTTPStatus.NOT_FOUND,
            "NotFoundError",
            f"The model `{model}` does not exist. Valid aliases: {config.model}.",
            "model",
        )
    if _int_field(body, "n", 1) != 1:
        raise _bad_request("the simulator supports n=1 only", "n")
    prompt_ids, prompt_text = api.prompt(body, config)
    param = api.max_tokens_param(body)
    requested = _int_field(body, param, api.default_max_tokens)
    if requested is not None and requested > config.max_model_len:
        raise _bad_request(
            f"{param}={requested} cannot be greater than max_model_len={config.max_model_len}. "
            f"Please request fewer output tokens. (parameter={param}, value={requested})",
            param,
        )
    room = config.max_model_len - len(prompt_ids)
    if room < 0:
        raise _bad_request(
            f"This model's maximum context length is {config.max_model_len} tokens. However, your prompt "
            f"contains {len(prompt_ids)} input tokens, which exceeds this limit even without any output "
            f"tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={len(prompt_ids)})",
            "input_tokens",
        )
    max_tokens = min(v for v in (room, requested, config.default_max_tokens) if v is not None)
    stream_options = body.get("stream_options") or {}
    include_usage = bool(stream_options.get("include_usage"))
    temperature = body.get("temperature")
    return _Job(
        prompt_token_ids=prompt_ids,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        min_tokens=_int_field(body, "min_tokens", 0) or 0,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stop_token_ids=frozenset(body.get("stop_token_ids") or ()),
        temperature=1.0 if temperature is None else float(temperature),
        seed=_int_field(body, "seed", None),
        stream=bool(body.get("stream", False)),
        include_usage=include_usage and not config.drop_usage,
        continuous_usage=include_usage
        and bool(stream_options.get("continuous_usage_stats"))
        and not config.drop_usage,
        return_token_ids=bool(body.get("return_token_ids")),
        return_prompt_text=bool(body.get("return_prompt_text")),
        logprobs=_logprobs_field(body),
        return_tokens_as_token_ids=bool(body.get("return_tokens_as_token_ids")),
    )


def _logprobs_field(body: dict[str, Any]) -> int | None:
    value = _int_field(body, "logprobs", None)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise _bad_request(
            f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}",
            "logprobs",
        )
    return value


_ENGINE: web.AppKey[_Engine] = web.AppKey("engine", _Engine)
_SEND_LOG: web.AppKey[SendLog] = web.AppKey("send_log", SendLog)


def _json_response(obj: Any, status: int = 200) -> web.Response:
    """Starlette's JSONResponse layout, which vLLM uses for every non-streaming body."""
    return web.Response(
        body=_dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def _sse(obj: Any) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


# Streaming errors go through json.dumps(...model_dump()) with default separators, unlike the chunks.
_ENGINE_DEAD_FRAME = (
    "data: "
    + json.dumps(
        _error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, HTTPStatus.INTERNAL_SERVER_ERROR)
    )
    + "\n\n"
).encode()
_DONE_FRAME = b"data: [DONE]\n\n"


def _reached(limit: int | None, count: int) -> bool:
    return limit is not None and count >= limit


async def _stream(request: web.Request, api: _Api, ctx: _Ctx, engine: _Engine) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    # A client that goes away mid-stream just ends the request, as vLLM aborts it.
    with suppress(ConnectionResetError):
        await _write_stream(request, resp, api, ctx, engine)
    return resp


async def _write_stream(
    request: web.Request, resp: web.StreamResponse, api: _Api, ctx: _Ctx, engine: _Engine
) -> None:
    cfg, job = engine.config, ctx.job
    send_log = request.app.get(_SEND_LOG)
    emitted = 0
    async with aclosing(engine.generate(job)) as steps:
        async for step in steps:
            if emitted == 0:
                for chunk in api.opening_chunks(ctx):
                    await resp.write(_sse(chunk))
            first = emitted == 0
            emitted += len(step.token_ids)
            usage = api.chunk_usage(len(job.prompt_token_ids), emitted) if job.continuous_usage else None
            # vLLM stamps the fingerprint on the terminal chunk only when no usage chunk follows.
            fingerprint = ctx.fingerprint if step.finish_reason and not job.include_usage else None
            choice = api.stream_choice(ctx, step, first)
            await resp.write(_sse(_envelope(ctx, api.chunk_object, [choice], usage, fingerprint)))
            if send_log is not None:
                send_log.record(ctx.request_id, step.due_ns, time.monotonic_ns(), emitted)
            if _reached(cfg.reset_after_tokens, emitted) and request.transport:
                request.transport.abort()
                return
            if _reached(cfg.error_after_tokens, emitted) and not step.finish_reason:
                # As in vLLM, the exception path skips the usage-only chunk but still sends [DONE].
                await resp.write(_ENGINE_DEAD_FRAME)
                break
        else:
            if job.include_usage:
                usage = _usage(len(job.prompt_token_ids), emitted)
                await resp.write(_sse(_envelope(ctx, api.chunk_object, [], usage, ctx.fingerprint)))
    if not cfg.no_done:
        await resp.write(_DONE_FRAME)
    await resp.write_eof()


async def _complete_row(
    request: web.Request, api: _Api, ctx: _Ctx, engine: _Engine
) -> tuple[dict[str, Any], int] | web.Response:
    """One engine request run to the end: its choice and token count, or the response a fault ends the
    request with."""
    cfg = engine.config
    text, token_ids, logprobs = "", [], []
    last = _Step(token_ids=[], text="")
    async with aclosing(engine.generate(ctx.job)) as steps:
        async for last in steps:
            text += last.text
            token_ids += last.token_ids
            logprobs += last.logprobs
            if _reached(cfg.reset_after_tokens, len(token_ids)) and request.transport:
                request.transport.abort()
                return web.Response()
            if _reached(cfg.error_after_tokens, len(token_ids)) and not last.finish_reason:
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                body = _error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, status)
                return _json_response(body, status)
    return api.full_choice(ctx, text, token_ids, last, logprobs), len(token_ids)


async def _complete(request: web.Request, api: _Api, ctxs: list[_Ctx], engine: _Engine) -> web.StreamResponse:
    """Rows run concurrently and are merged as vLLM merges a prompt list: choice i is prompt i, usage
    is summed, and the first row a fault ends decides the response."""
    ctx = ctxs[0]
    rows = await asyncio.gather(*(_complete_row(request, api, row_ctx, engine) for row_ctx in ctxs))
    choices, completion_tokens = [], 0
    for index, row in enumerate(rows):
        if isinstance(row, web.Response):
            return row
        choice, tokens = row
        choices.append({**choice, "index": index})
        completion_tokens += tokens
    prompt_tokens = sum(len(row_ctx.job.prompt_token_ids) for row_ctx in ctxs)
    body: dict[str, Any] = {
        "id": ctx.request_id,
        "object": api.full_object,
        "created": ctx.created,
        "model": ctx.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": ctx.fingerprint,
        "usage": _full_usage(prompt_tokens, completion_tokens),
        **api.full_extra(ctx),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    return _json_response(body)


def _handler(api: _Api) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        engine = request.app[_ENGINE]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise _bad_request("request body must be a JSON object", "body")
            jobs = [_parse_job(api, row, engine.config) for row in api.rows(body)]
            if len(jobs) > 1 and jobs[0].stream:
                raise _bad_request(
                    "the simulator streams a single prompt; send a list without stream", "prompt"
                )
        except json.JSONDecodeError as exc:
            return _json_response(_bad_request(f"invalid JSON: {exc}", "body").body(), HTTPStatus.BAD_REQUEST)
        except SimError as exc:
            return _json_response(exc.body(), exc.status)
        request_id = request.headers.get("X-Request-Id") or f"{uuid.uuid4().int & (2**64 - 1):016x}"
        created = int(time.time())
        ctxs = [
            _Ctx(
                request_id=f"{api.id_prefix}{request_id}",
                created=created,
                model=engine.config.model,
                fingerprint=engine.config.system_fingerprint,
                job=job,
            )
            for job in jobs
        ]
        engine.in_flight += len(ctxs)
        try:
            if jobs[0].stream:
                return await _stream(request, api, ctxs[0], engine)
            return await _complete(request, api, ctxs, engine)
        finally:
            engine.in_flight -= len(ctxs)

    return handle


def model_list(cfg: SimConfig) -> dict[str, Any]:
    """The /v1/models body; shared with the ground-truth server so both serve vLLM's exact card."""
    created = int(time.time())
    permission = {
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
    card = {
        "id": cfg.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


async def _models(request: web.Request) -> web.Response:
    return _json_response(model_list(request.app[_ENGINE].config))


async def _version(request: web.Request) -> web.Response:
    return _json_response({"version": VLLM_VERSION})


async def _health(request: web.Request) -> web.Response:
    return web.Response()


def make_app(config: SimConfig, send_log: SendLog | None = None) -> web.Application:
    """The simulator as an aiohttp application, for embedding or for aiohttp's test client. With a send
    log, each streamed content chunk's due and actual send time is recorded in it (the truth server's
    format, so `itlaudit.analysis.fidelity` can grade a client against the simulator too)."""
    engine = _Engine(config)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_MetricsCollector(engine))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app[_ENGINE] = engine
    if send_log is not None:
        app[_SEND_LOG] = send_log
    app.router.add_post("/v1/completions", _handler(_CompletionApi()))
    app.router.add_post("/v1/chat/completions", _handler(_ChatApi()))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/version", _version)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def run_sim(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0, send_log: SendLog | None = None
) -> AsyncIterator[str]:
    """Serve in the current event loop for the duration of the block; yields the base URL.

    ``port=0`` lets the OS pick a free port, so parallel tests never collide.
    """
    runner = web.AppRunner(make_app(config, send_log), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        yield f"http://{url_host}:{bound_port}"
    finally:
        await runner.cleanup()


def serve(
    config: SimConfig, host: str = "127.0.0.1", port: int = 8000, send_log_path: Path | None = None
) -> None:
    """Blocking entry point for ``itlaudit sim``; returns when interrupted, then writes the send log."""
    send_log = None if send_log_path is None else SendLog(server={"kind": "sim", **asdict(config)})
    web.run_app(make_app(config, send_log), host=host, port=port, access_log=None)
    if send_log is not None and send_log_path is not None:
        send_log.write(send_log_path)
