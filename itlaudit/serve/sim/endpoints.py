"""What differs between /v1/completions and /v1/chat/completions: prompts, choices, opening chunks."""

from __future__ import annotations

from abc import ABC, abstractmethod

from itlaudit.model.jsonvalue import JSONMapping, JSONObject, JSONValue, ReadOnlyJSON
from itlaudit.serve.sim.config import SimConfig
from itlaudit.serve.sim.engine import Step, TokenLogprob
from itlaudit.serve.sim.vocab import tokenize
from itlaudit.serve.sim.wire import (
    ResponseContext,
    bad_request,
    chunk_envelope,
    completion_logprobs,
    usage_info,
)


class EndpointApi(ABC):
    """What differs between /v1/completions and /v1/chat/completions; the streaming loop is shared."""

    id_prefix: str
    chunk_object: str
    full_object: str
    # /v1/completions defaults max_tokens to 16 (CompletionRequest); chat leaves it unset.
    default_max_tokens: int | None

    @abstractmethod
    def prompt(self, body: JSONMapping, config: SimConfig) -> tuple[list[int], str]:
        """Prompt token ids and the prompt text (the rendered template, for chat)."""

    def max_tokens_param(self, body: JSONMapping) -> str:
        return "max_tokens"

    def rows(self, body: JSONMapping) -> list[JSONMapping]:
        """The request body of each engine request this API request fans out into."""
        return [body]

    def chunk_usage(self, prompt_tokens: int, completion_tokens: int) -> JSONObject:
        return usage_info(prompt_tokens, completion_tokens)

    def opening_chunks(self, ctx: ResponseContext) -> list[JSONObject]:
        return []

    @abstractmethod
    def stream_choice(self, ctx: ResponseContext, step: Step, first: bool) -> JSONObject:
        """The single choice of a streamed chunk carrying one engine step."""

    @abstractmethod
    def full_choice(
        self, ctx: ResponseContext, text: str, token_ids: list[int], last: Step, logprobs: list[TokenLogprob]
    ) -> JSONObject:
        """The single choice of a non-streaming response."""

    def full_extra(self, ctx: ResponseContext) -> JSONObject:
        return {}


class CompletionApi(EndpointApi):
    id_prefix = "cmpl-"
    chunk_object = "text_completion"
    full_object = "text_completion"
    default_max_tokens = 16

    def prompt(self, body: JSONMapping, config: SimConfig) -> tuple[list[int], str]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt), ""
        if isinstance(prompt, str):
            return tokenize(prompt, config), prompt
        raise bad_request("the simulator accepts a string or a list of token ids per prompt", "prompt")

    def rows(self, body: JSONMapping) -> list[JSONMapping]:
        # A list of strings is a batch: vLLM submits one engine request per prompt, all at once.
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [{**body, "prompt": p} for p in prompt]
        return [body]

    def stream_choice(self, ctx: ResponseContext, step: Step, first: bool) -> JSONObject:
        job = ctx.job
        return {
            "index": 0,
            "text": step.text,
            "logprobs": None,
            "finish_reason": step.finish_reason,
            "stop_reason": step.stop_reason,
            "prompt_token_ids": _shown_ids(job.prompt_token_ids, first and job.return_token_ids),
            "token_ids": _shown_ids(step.token_ids, job.return_token_ids),
        }

    def full_choice(
        self, ctx: ResponseContext, text: str, token_ids: list[int], last: Step, logprobs: list[TokenLogprob]
    ) -> JSONObject:
        job = ctx.job
        return {
            "index": 0,
            "text": text,
            "logprobs": None if job.logprobs is None else completion_logprobs(logprobs),
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
            "token_ids": _shown_ids(token_ids, job.return_token_ids),
            "prompt_logprobs": ctx.prompt_logprobs,
            "prompt_token_ids": _shown_ids(job.prompt_token_ids, job.return_token_ids),
            "routed_experts": None,
        }


class ChatApi(EndpointApi):
    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"
    full_object = "chat.completion"
    default_max_tokens = None

    def prompt(self, body: JSONMapping, config: SimConfig) -> tuple[list[int], str]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("messages must be a non-empty list", "messages")
        rendered = "".join(
            f"<|{m.get('role')}|>\n{_message_text(m.get('content'))}<|end|>\n" for m in messages
        )
        rendered += "<|assistant|>\n"
        return tokenize(rendered, config), rendered

    def max_tokens_param(self, body: JSONMapping) -> str:
        return "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"

    def chunk_usage(self, prompt_tokens: int, completion_tokens: int) -> JSONObject:
        # The chat server passes completion_tokens_details explicitly (None without a reasoning parser),
        # so it is serialised on every chunk except the exclude_none usage-only one.
        return {**usage_info(prompt_tokens, completion_tokens), "completion_tokens_details": None}

    def opening_chunks(self, ctx: ResponseContext) -> list[JSONObject]:
        job = ctx.job
        return [
            chunk_envelope(
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
                prompt_token_ids=_shown_ids(job.prompt_token_ids, job.return_token_ids),
                prompt_text=job.prompt_text if job.return_prompt_text else None,
            )
        ]

    def stream_choice(self, ctx: ResponseContext, step: Step, first: bool) -> JSONObject:
        choice: JSONObject = {
            "index": 0,
            "delta": {"content": step.text},
            "logprobs": None,
            "finish_reason": step.finish_reason,
        }
        if step.finish_reason:
            # Only the terminal chunk passes stop_reason explicitly, so only it serialises the key.
            choice["stop_reason"] = step.stop_reason
        choice["token_ids"] = _shown_ids(step.token_ids, ctx.job.return_token_ids)
        return choice

    def full_choice(
        self, ctx: ResponseContext, text: str, token_ids: list[int], last: Step, logprobs: list[TokenLogprob]
    ) -> JSONObject:
        message: JSONObject = {
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
            "token_ids": _shown_ids(token_ids, ctx.job.return_token_ids),
            "routed_experts": None,
        }

    def full_extra(self, ctx: ResponseContext) -> JSONObject:
        job = ctx.job
        return {
            "prompt_logprobs": None,
            "prompt_token_ids": _shown_ids(job.prompt_token_ids, job.return_token_ids),
            "prompt_text": job.prompt_text if job.return_prompt_text else None,
        }


def _shown_ids(ids: list[int], shown: bool) -> JSONValue:
    """Token ids as a JSON field: the list when the request asked for ids (return_token_ids), else null."""
    return [*ids] if shown else None


def _message_text(content: ReadOnlyJSON) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
