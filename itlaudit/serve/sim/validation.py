"""Request validation and defaulting, as vLLM does it, into the sampling parameters of one engine request."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from itlaudit.errors import SimError
from itlaudit.model.jsonvalue import JSONMapping
from itlaudit.serve.sim.config import SGLANG, SimConfig
from itlaudit.serve.sim.endpoints import EndpointApi
from itlaudit.serve.sim.engine import Job
from itlaudit.serve.sim.wire import bad_request

# vLLM's default --max-logprobs.
MAX_LOGPROBS = 20


def _int_field(body: JSONMapping, name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default  # vLLM treats an explicit null like an omitted field (normalize_null_max_tokens)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"{name} must be an integer", name)
    return value


def parse_job(api: EndpointApi, body: JSONMapping, config: SimConfig) -> Job:
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
        raise bad_request("the simulator supports n=1 only", "n")
    prompt_ids, prompt_text = api.prompt(body, config)
    # vLLM's truncate_prompt_tokens: only the last N prompt tokens are kept (and counted in usage).
    keep = _int_field(body, "truncate_prompt_tokens", None)
    if keep is not None and 0 < keep < len(prompt_ids):
        prompt_ids = prompt_ids[-keep:]
    param = api.max_tokens_param(body)
    requested = _int_field(body, param, api.default_max_tokens)
    if requested is not None and requested > config.max_model_len:
        raise bad_request(
            f"{param}={requested} cannot be greater than max_model_len={config.max_model_len}. "
            f"Please request fewer output tokens. (parameter={param}, value={requested})",
            param,
        )
    room = config.max_model_len - len(prompt_ids)
    if room < 0:
        raise bad_request(
            f"This model's maximum context length is {config.max_model_len} tokens. However, your prompt "
            f"contains {len(prompt_ids)} input tokens, which exceeds this limit even without any output "
            f"tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={len(prompt_ids)})",
            "input_tokens",
        )
    max_tokens = min(v for v in (room, requested, config.default_max_tokens) if v is not None)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = bool(stream_options.get("include_usage"))
    sglang = config.dialect == SGLANG
    # SGLang builds without continuous usage ignore the option: usage comes in the last chunk only
    continuous = bool(stream_options.get("continuous_usage_stats")) and (
        not sglang or config.sglang_continuous_usage
    )
    temperature = body.get("temperature")
    if not isinstance(temperature, int | float | str | None):
        raise bad_request("temperature must be a number", "temperature")
    return Job(
        prompt_token_ids=prompt_ids,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        min_tokens=_int_field(body, "min_tokens", 0) or 0,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stop_token_ids=_stop_token_ids(body),
        temperature=1.0 if temperature is None else float(temperature),
        seed=_int_field(body, "seed", None),
        stream=bool(body.get("stream", False)),
        include_usage=include_usage and not config.drop_usage,
        continuous_usage=include_usage and continuous and not config.drop_usage,
        return_token_ids=bool(body.get("return_token_ids")) and not sglang,
        return_prompt_text=bool(body.get("return_prompt_text")),
        logprobs=_logprobs_field(body, "logprobs", "sample"),
        # SGLang's CompletionRequest (pydantic, extra fields ignored) has neither: its logprobs are
        # keyed by token text, and prompt logprobs come only from /generate (serve/sim/sglang.py).
        return_tokens_as_token_ids=bool(body.get("return_tokens_as_token_ids")) and not sglang,
        prompt_logprobs=None if sglang else _prompt_logprobs_field(body),
    )


def _stop_token_ids(body: JSONMapping) -> frozenset[int]:
    value = body.get("stop_token_ids") or []
    ids = (
        [t for t in value if isinstance(t, int) and not isinstance(t, bool)]
        if isinstance(value, list)
        else []
    )
    if not isinstance(value, list) or len(ids) != len(value):
        raise bad_request("stop_token_ids must be a list of integers", "stop_token_ids")
    return frozenset(ids)


def _logprobs_field(body: JSONMapping, name: str, kind: str) -> int | None:
    value = _int_field(body, name, None)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(
            f"Requested {kind} logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}",
            name,
        )
    return value


def _prompt_logprobs_field(body: JSONMapping) -> int | None:
    """vLLM scores the prompt only in a non-streaming request (its streaming path has no place for it)."""
    value = _logprobs_field(body, "prompt_logprobs", "prompt")
    if value is not None and body.get("stream"):
        raise bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    return value
