"""The simulator's SGLang dialect (`itlaudit sim --dialect sglang`): what an SGLang server says where
it differs from vLLM, field for field from SGLang's sources (github sgl-project/sglang, python/sglang/):

- the native `POST /generate` stream (srt/entrypoints/http_server.py `generate_request`): one
  `data: {"text", "output_ids", "meta_info"}` event per engine step, the text and ids cumulative, then
  `data: [DONE]`; with `--sglang-incremental-output` (SGLang's --incremental-streaming-output) each
  step's text and ids only, and meta_info's output logprob lists from that step on
  (tokenizer_manager.py `_slice_streaming_output_meta_info`); an error mid-stream is
  `data: {"error": {"message": ...}}` before [DONE];
- `meta_info` (srt/managers/tokenizer_manager.py `_handle_batch_output`): id, finish_reason (None, or
  schedule_batch.py's `{"type": "length", "length": N}` / `{"type": "stop", "matched": id}`),
  prompt_tokens, weight_version, total_retractions, the cumulative completion_tokens, cached_tokens;
  on the last chunk of a speculating server `_calculate_spec_decoding_metrics`'s spec_accept_rate,
  spec_accept_length (completion_tokens / spec_verify_ct), spec_accept_token_num,
  spec_draft_token_num, spec_verify_ct; then e2e_latency;
- `/server_info` and `/get_server_info` (server args, scheduler info, `version`) and `/model_info`,
  `/get_model_info` (model_path, tokenizer_path, is_generation) instead of vLLM's /version;
- its OpenAI streams' choices (srt/entrypoints/openai/serving_completions.py): `matched_stop` for
  vLLM's stop_reason, no token ids, usage on every chunk only where the build honours
  `stream_options.continuous_usage_stats` (`--sglang-continuous-usage`; else only in the last chunk);
- logprobs, as 0.5.12.post1 has them (read in its wheel): /v1/completions keys `top_logprobs` by token
  TEXT (entrypoints/openai/utils.py `to_openai_style_logprobs`: `{token[2]: token[0]}`, text_offset -1)
  and ignores vLLM's `return_tokens_as_token_ids` and `prompt_logprobs` (protocol.py's
  CompletionRequest lets pydantic drop unknown fields); ids come from /generate's `return_logprob`,
  `top_logprobs_num` and `logprob_start_len` (managers/io_struct.py GenerateReqInput), whose
  meta_info carries `output_token_logprobs`, `output_top_logprobs`, `input_token_logprobs` and
  `input_top_logprobs` as lists of [logprob, token_id, text or None] (tokenizer_manager.py
  `add_logprob_to_meta_info`, `detokenize_logprob_tokens`; the text only with
  `return_text_in_logprobs`), the input ones from `logprob_start_len` on with None for the first
  position's logprob (scheduler_output_processor_mixin.py `_process_input_token_logprobs`); a `text`
  or `input_ids` list is a batch, answered as a list (tokenizer_manager.py `_handle_batch_request`);
- /metrics as `sglang:*` (srt/metrics/collector.py), labelled model_name, engine_type, tp_rank, pp_rank.

It stays the simulator: its version (in /server_info) is `itlaudit-sim …`, so runs against it are
labelled simulated. What was not checked against a running SGLang: everything (there is no SGLang CPU
wheel here); the layouts are read from the sources named above.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from itlaudit.model.jsonvalue import JSONMapping, JSONObject, JSONValue
from itlaudit.serve.sim.config import SIM_VERSION, SimConfig
from itlaudit.serve.sim.endpoints import CompletionApi
from itlaudit.serve.sim.engine import Engine, Job, Step, TokenLogprob
from itlaudit.serve.sim.validation import parse_job
from itlaudit.serve.sim.vocab import token_bytes
from itlaudit.serve.sim.wire import DONE_FRAME, bad_request, sse_frame

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# SamplingParams' default max_new_tokens (srt/sampling/sampling_params.py).
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
_ERROR_MESSAGE = "The engine hit an error (injected by the simulator)."
# meta_info's lists that --incremental-streaming-output sends from the step on
# (tokenizer_manager.py _INCREMENTAL_STREAMING_META_INFO_KEYS)
_OUTPUT_LISTS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def openai_choice(choice: JSONObject) -> JSONObject:
    """A vLLM-layout choice (streamed or not) as SGLang's OpenAI layer writes it: the stop it matched
    as `matched_stop`, no token ids or prompt logprobs (older builds have no return_token_ids), and
    logprobs without text offsets (`to_openai_style_logprobs`: -1, "not supported yet")."""
    drop = ("stop_reason", "token_ids", "prompt_token_ids", "prompt_logprobs")
    shown = {k: v for k, v in choice.items() if k not in drop}
    if choice.get("finish_reason") is not None:
        shown["matched_stop"] = choice.get("stop_reason")
    logprobs = choice.get("logprobs")
    offsets = logprobs.get("text_offset") if isinstance(logprobs, dict) else None
    if isinstance(logprobs, dict) and isinstance(offsets, list):
        shown["logprobs"] = {**logprobs, "text_offset": [-1 for _ in offsets]}
    return shown


@dataclass(frozen=True)
class LogprobAsk:
    """What a /generate body asks of logprobs (GenerateReqInput's `top_logprobs_num`,
    `logprob_start_len`, -1 for none of the prompt, and `return_text_in_logprobs`)."""

    top_logprobs_num: int
    logprob_start_len: int
    return_text: bool


@dataclass(frozen=True)
class GenerateRequest:
    """One /generate body: its rows' jobs, whether it was a batch (a `text`/`input_ids` list, answered
    as a list), and its logprob ask (None without `return_logprob`)."""

    jobs: list[Job]
    batched: bool
    logprobs: LogprobAsk | None


def _int_of(body: JSONMapping, name: str, default: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer", name)
    return value


def generate_request(body: JSONMapping, config: SimConfig) -> GenerateRequest:
    """A /generate body (`text` or `input_ids`, one or a list; `sampling_params` in SGLang's names; the
    logprob fields) as the engine's jobs, through the completions validation (same limits, same
    refusals)."""
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise bad_request("sampling_params must be an object", "sampling_params")
    prompt = body.get("text", body.get("input_ids"))
    batched = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str | list)
    rows = prompt if batched and isinstance(prompt, list) else [prompt]
    max_new = sampling.get("max_new_tokens")
    ask = None
    if body.get("return_logprob"):
        top, start = _int_of(body, "top_logprobs_num", 0), _int_of(body, "logprob_start_len", -1)
        ask = LogprobAsk(top, start, bool(body.get("return_text_in_logprobs")))
    requests: list[JSONMapping] = [
        {
            "prompt": row,
            "max_tokens": SGLANG_DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new,
            "min_tokens": sampling.get("min_new_tokens"),
            "ignore_eos": sampling.get("ignore_eos", False),
            "stop_token_ids": sampling.get("stop_token_ids"),
            "temperature": sampling.get("temperature"),
            "seed": sampling.get("sampling_seed"),
            "stream": body.get("stream", False),
            "logprobs": None if ask is None else ask.top_logprobs_num,
        }
        for row in rows
    ]
    jobs = [parse_job(CompletionApi(), request, config) for request in requests]
    if batched and jobs[0].stream:
        raise bad_request("the simulator streams a single prompt; send a list without stream", "text")
    return GenerateRequest(jobs, batched, ask)


def _entry(logprob: float | None, token: int, ask: LogprobAsk, config: SimConfig) -> JSONValue:
    """One [logprob, token_id, text or None] entry (the text only with return_text_in_logprobs)."""
    text = token_bytes(token, config).decode("utf-8", errors="replace") if ask.return_text else None
    return [logprob, token, text]


def _input_logprobs(engine: Engine, job: Job, ask: LogprobAsk) -> JSONObject:
    """The prompt's entries from logprob_start_len on, the first position's logprob None, and with
    top_logprobs_num its candidates (None at the first position); the model's log p(token | prev)."""
    ids, start = job.prompt_token_ids, ask.logprob_start_len
    cfg, lm = engine.config, engine.lm
    tokens: list[JSONValue] = []
    tops: list[JSONValue] = []
    if 0 <= start < len(ids):  # SGLang: -1, or past the prompt, scores none of it
        tokens.append(_entry(None, ids[start], ask, cfg))
        tops.append(None)
        for prev, token in itertools.pairwise(ids[start:]):
            tokens.append(_entry(lm.logprob(prev, token), token, ask, cfg))
            ranked = [int(t) for t in (-lm.logits(prev)).argsort(kind="stable")[: ask.top_logprobs_num]]
            tops.append([_entry(lm.logprob(prev, t), t, ask, cfg) for t in ranked])
    out: JSONObject = {"input_token_logprobs": tokens}
    if ask.top_logprobs_num:
        out["input_top_logprobs"] = tops
    return out


def _output_logprobs(entries: list[TokenLogprob], ask: LogprobAsk, config: SimConfig) -> JSONObject:
    """The output so far: each token's entry and, with top_logprobs_num, its candidates best first."""
    out: JSONObject = {
        "output_token_logprobs": [_entry(e.logprob, e.token_id, ask, config) for e in entries],
        "output_token_logprobs_length": len(entries),
    }
    if ask.top_logprobs_num:
        out["output_top_logprobs"] = [
            [_entry(value, tok, ask, config) for tok, value in e.ranked] for e in entries
        ]
    return out


def _finish_reason(step: Step, job: Job, eos_token_id: int) -> JSONValue:
    if step.finish_reason == "length":
        return {"type": "length", "length": job.max_tokens}
    if step.finish_reason == "stop":
        return {"type": "stop", "matched": step.stop_reason if step.stop_reason is not None else eos_token_id}
    return None


async def native_frames(
    engine: Engine, job: Job, started: float, ask: LogprobAsk | None = None
) -> AsyncIterator[tuple[JSONObject, Step]]:
    """Each engine step's /generate object (cumulative text and ids, and logprobs when asked) with its
    step."""
    cfg = engine.config
    rid = uuid.uuid4().hex
    text, ids, entries = "", [], []
    prompt_part = _input_logprobs(engine, job, ask) if ask is not None else {}
    async with aclosing(engine.generate(job)) as steps:
        async for step in steps:
            text += step.text
            ids += step.token_ids
            entries += step.logprobs
            meta: JSONObject = {
                "id": rid,
                "finish_reason": _finish_reason(step, job, cfg.eos_token_id),
                "prompt_tokens": len(job.prompt_token_ids),
                "weight_version": "default",
                "total_retractions": 0,
                "completion_tokens": len(ids),
                "cached_tokens": 0,
            }
            if ask is not None:
                meta |= {**prompt_part, **_output_logprobs(entries, ask, cfg)}
            if step.finish_reason is not None:
                if step.spec_decode is not None:
                    counts = step.spec_decode.to_dict(lie=cfg.spec_metrics_lie)
                    steps_done, accepted = counts["num_spec_steps"], counts["num_accepted_draft_tokens"]
                    drafted = counts["num_draft_tokens"]
                    assert isinstance(steps_done, int) and isinstance(accepted, int)
                    assert isinstance(drafted, int)
                    meta["spec_accept_rate"] = accepted / drafted if drafted else 0.0
                    meta["spec_accept_length"] = len(ids) / steps_done if steps_done else 0
                    meta["spec_accept_token_num"] = accepted
                    meta["spec_draft_token_num"] = drafted
                    meta["spec_verify_ct"] = steps_done
                meta["e2e_latency"] = time.time() - started
            yield {"text": text, "output_ids": [*ids], "meta_info": meta}, step


async def stream_generate(
    request: web.Request, engine: Engine, asked: GenerateRequest, started: float
) -> web.StreamResponse:
    """The native stream (one row): one event per step, [DONE] after the last (or after an error
    event)."""
    cfg = engine.config
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    emitted = 0
    async for frame, step in native_frames(engine, asked.jobs[0], started, asked.logprobs):
        if cfg.sglang_incremental_output:
            await resp.write(sse_frame(_piece(frame, step, emitted)))
        else:
            await resp.write(sse_frame(frame))
        emitted += len(step.token_ids)
        if cfg.error_after_tokens is not None and emitted >= cfg.error_after_tokens:
            await resp.write(sse_frame({"error": {"message": _ERROR_MESSAGE}}))
            break
    if not cfg.no_done:
        await resp.write(DONE_FRAME)
    await resp.write_eof()
    return resp


def _piece(frame: JSONObject, step: Step, sent: int) -> JSONObject:
    """A cumulative /generate object as --incremental-streaming-output sends it: the step's own text
    and ids, the output logprob lists past the `sent` ids before it."""
    meta = frame["meta_info"]
    assert isinstance(meta, dict)
    sliced = {key: value[sent:] for key in _OUTPUT_LISTS if isinstance(value := meta.get(key), list)}
    return {"text": step.text, "output_ids": list(step.token_ids), "meta_info": {**meta, **sliced}}


async def complete_generate(engine: Engine, asked: GenerateRequest, started: float) -> JSONValue:
    """The non-streaming answer: each row's last object, the rows run concurrently (one list for a
    batch)."""

    async def last_of(job: Job) -> JSONValue:
        last: JSONObject = {}
        async for frame, _ in native_frames(engine, job, started, asked.logprobs):
            last = frame
        return last

    rows = await asyncio.gather(*(last_of(job) for job in asked.jobs))
    return list(rows) if asked.batched else rows[0]


def server_info(config: SimConfig) -> JSONObject:
    """/server_info's layout: the server args, the scheduler's, and `version` (the simulator's)."""
    speculates = bool(config.num_speculative_tokens)
    return {
        "model_path": config.model,
        "tokenizer_path": config.model,
        "served_model_name": config.model,
        "context_length": config.max_model_len,
        "speculative_algorithm": "NGRAM" if speculates else None,
        "speculative_num_draft_tokens": config.num_speculative_tokens + 1 if speculates else None,
        "incremental_streaming_output": config.sglang_incremental_output,
        "max_total_num_tokens": config.kv_cache_tokens,
        "internal_states": [{}],
        "version": SIM_VERSION,
    }


def model_info(config: SimConfig) -> JSONObject:
    """/model_info's layout."""
    return {"model_path": config.model, "tokenizer_path": config.model, "is_generation": True}


def info_routes(config: SimConfig) -> list[tuple[str, JSONObject]]:
    """The info endpoints under both their names (the `get_` ones are the older)."""
    info, model = server_info(config), model_info(config)
    return [
        ("/server_info", info),
        ("/get_server_info", info),
        ("/model_info", model),
        ("/get_model_info", model),
    ]


class SGLangMetrics(Collector):
    """/metrics as SGLang names it: the scheduler's gauges and the tokenizer's counters."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._last = (time.monotonic(), 0)

    def collect(self) -> Iterable[Metric]:
        engine, cfg, load = self.engine, self.engine.config, self.engine.load
        labels = {"engine_type": "unified", "model_name": cfg.model, "pp_rank": "0", "tp_rank": "0"}
        names = sorted(labels)
        values = [labels[k] for k in names]
        now = time.monotonic()
        then, tokens = self._last
        self._last = (now, engine.generation_tokens)
        spec = engine.spec
        accept = 1.0 + spec.num_accepted_tokens / spec.num_drafts if spec.num_drafts else 0.0
        gauges = {
            "sglang:num_running_reqs": ("The number of running requests.", load.running),
            "sglang:num_used_tokens": ("The number of used tokens.", load.kv_usage * load.kv_cache_tokens),
            "sglang:token_usage": ("The token usage.", load.kv_usage),
            "sglang:gen_throughput": (
                "The generation throughput (token/s).",
                (engine.generation_tokens - tokens) / (now - then) if now > then else 0.0,
            ),
            "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", load.waiting),
            "sglang:cache_hit_rate": ("The prefix cache hit rate.", 0.0),
            "sglang:spec_accept_length": ("The average acceptance length of speculative decoding.", accept),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, float(value))
            yield gauge
        counters = {
            "sglang:prompt_tokens": ("Number of prefill tokens processed.", engine.prompt_tokens),
            "sglang:generation_tokens": ("Number of generation tokens processed.", engine.generation_tokens),
            "sglang:num_requests": ("Number of requests processed.", sum(engine.finished.values())),
        }
        for name, (doc, count) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, float(count), created=engine.started)
            yield counter
