"""Requests prepared before a run: the body each endpoint takes, JSON-encoded once, ahead of the streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec

from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.records import RequestParams, RequestRecord
from itlaudit.model.redact import redact_url
from itlaudit.model.vocabulary import Endpoint

# What a request sends as its prompt: text, token ids (completions), or a dataset's chat messages,
# which are JSON objects passed through to the server as they are.
Prompt: TypeAlias = str | list[int] | list[JSONObject]


def build_body(
    endpoint: Endpoint,
    model: str,
    prompt: Prompt,
    params: RequestParams,
    extra_body: JSONObject | None = None,
) -> JSONObject:
    """The request JSON. Unset limits are left out rather than sent as null or defaults, because
    what a request leaves to the server (e.g. no max_tokens) is itself what some findings audit.

    Continuous usage stats are what make token-true ITL possible: every chunk then carries the
    server's cumulative completion_tokens. `extra_body` is applied last (shallow) so a scenario can
    override anything, including the stream options. A prompt is text, token ids (completions: the
    server takes them as they are) or, for chat, a dataset's whole message list.
    """
    sent: JSONValue = prompt if isinstance(prompt, str) else list[JSONValue](prompt)
    if endpoint == Endpoint.GENERATE:
        return _generate_body(prompt, sent, params, extra_body)
    body: JSONObject = {"model": model}
    if endpoint == Endpoint.COMPLETIONS:
        body["prompt"] = sent
    elif endpoint == Endpoint.CHAT:
        is_messages = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
        body["messages"] = sent if is_messages else [{"role": "user", "content": sent}]
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {', '.join(Endpoint)}")
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


def _generate_body(
    prompt: Prompt, sent: JSONValue, params: RequestParams, extra_body: JSONObject | None
) -> JSONObject:
    """SGLang's native /generate body (`GenerateReqInput`, its `sampling_params` as SGLang's
    SamplingParams names them: max_new_tokens, min_new_tokens, ignore_eos, stop_token_ids, temperature,
    sampling_seed; python/sglang/srt/entrypoints/openai/serving_completions.py maps the OpenAI names
    onto these). It takes no model name and no stream options: every chunk carries
    `meta_info.completion_tokens` whatever is asked. Chat messages have no place in it (a scenario
    with a messages dataset must use endpoint = "chat")."""
    sampling: JSONObject = {}
    if params.max_tokens is not None:
        sampling["max_new_tokens"] = params.max_tokens
    if params.min_tokens is not None:
        sampling["min_new_tokens"] = params.min_tokens
    if params.ignore_eos:
        sampling["ignore_eos"] = True
    if params.stop_token_ids:
        sampling["stop_token_ids"] = list(params.stop_token_ids)
    if params.temperature is not None:
        sampling["temperature"] = params.temperature
    if params.seed is not None:
        sampling["sampling_seed"] = params.seed
    body: JSONObject = {"text" if isinstance(prompt, str) else "input_ids": sent}
    body["sampling_params"] = sampling
    body["stream"] = True
    if extra_body:
        body.update(extra_body)
    return body


@dataclass(frozen=True)
class PlannedRequest:
    """One request, fully prepared before the run starts (body already JSON-encoded), so the capture
    loop does no encoding while other streams are open."""

    request_id: str
    variant: str
    endpoint: Endpoint
    url: str
    model: str
    params: RequestParams
    payload: bytes
    scheduled_ms: float | None = None  # open loop: due this long after the variant's start
    warmup: bool = False
    category: str | None = None
    record_url: str | None = None  # the url as records keep it, userinfo masked; None: the url itself
    session: int | None = None  # a multi-turn session: its requests run in order on one capture worker
    think_s: float = 0.0  # in a session: the pause after the previous turn's reply before this one
    sent_prompt_tokens: int | None = None  # a token-id prompt's length (the record's, for its rule)

    def new_record(self, **outcome: Any) -> RequestRecord:
        """The record this request's outcome fills in: who it was and what it asked for come from the
        plan, whoever writes the record (the streaming client, or the coordinator for a lost worker)."""
        return RequestRecord(
            request_id=self.request_id,
            variant=self.variant,
            endpoint=self.endpoint,
            url=self.record_url or self.url,
            model=self.model,
            params=self.params,
            scheduled_ms=self.scheduled_ms,
            warmup=self.warmup,
            category=self.category,
            sent_prompt_tokens=self.sent_prompt_tokens,
            **outcome,
        )


def plan_request(
    *,
    base_url: str,
    endpoint: Endpoint,
    model: str,
    prompt: Prompt,
    params: RequestParams,
    request_id: str,
    variant: str,
    extra_body: JSONObject | None = None,
    scheduled_ms: float | None = None,
    warmup: bool = False,
    category: str | None = None,
    session: int | None = None,
    think_s: float = 0.0,
) -> PlannedRequest:
    body = build_body(endpoint, model, prompt, params, extra_body)
    url = base_url.rstrip("/") + Endpoint(endpoint).path
    # msgspec: a long token-id prompt encodes ~4x faster than with json (and in UTF-8, not \u escapes)
    payload = msgspec.json.encode(body)
    return PlannedRequest(
        request_id,
        variant,
        endpoint,
        url,
        model,
        params,
        payload,
        scheduled_ms,
        warmup,
        category,
        redact_url(url),
        session,
        think_s,
        _token_count(prompt),
    )


def _token_count(prompt: Prompt) -> int | None:
    """A token-id prompt's length: the tokens the server must count as usage.prompt_tokens. A text
    prompt or chat messages are tokenized by the server (and a chat template adds its own): None."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return None
