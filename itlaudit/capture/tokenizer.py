"""The server's own tokenizer, over /tokenize and /detokenize, for a random dataset on the chat endpoint.

/v1/chat/completions takes text, not token ids, and itlaudit carries no tokenizer, so the only way to
give a chat message exactly `input_len` tokens of the served model is to ask the server: detokenize the
drawn ids, tokenize the text, correct (`model.datasets.refit_ids`) and go round again until the counts
match, as vllm bench serve does with its local tokenizer. The chat template then adds tokens of its
own; /tokenize with the messages says how many, which is what the records' usage.prompt_tokens will
show. A server without these endpoints (404) gets one line saying so, since without them the prompt
length would be a guess.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from itlaudit.capture.described import RandomChat
from itlaudit.capture.planning import OnPrepare, Pacer
from itlaudit.errors import ServerAnswerError, ServerStatusError
from itlaudit.model.datasets import (
    MAX_ROUND_TRIPS,
    chat_prompt_note,
    refit_ids,
    refit_rng,
    usable_text,
)
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.scenario import Scenario
from itlaudit.model.vocabulary import Endpoint
from itlaudit.side.client import SideClient, server_error_message

_TIMEOUT_S = 60.0  # a round trip of a long prompt on a busy server
_IN_FLIGHT = 8  # round trips at once: enough to hide latency, few enough not to crowd a small server


@dataclass(frozen=True)
class ChatPrompts:
    """A random dataset's entries as chat messages, and their lengths in the served model's tokens."""

    scenario: Scenario  # the scenario whose dataset entries are now messages
    input_lens: list[int]  # per entry: what the dataset drew
    content_tokens: list[int]  # per entry: the message text alone, by /tokenize
    prompt_tokens: list[int]  # per entry: with the chat template, by /tokenize (= usage.prompt_tokens)

    def note(self) -> str:
        return chat_prompt_note(self.input_lens, self.content_tokens, self.prompt_tokens)

    def describe(self) -> RandomChat:
        """meta.json's `random_chat`: enough to relate each record's prompt_tokens to its input_len."""
        return RandomChat(
            input_lens=self.input_lens,
            content_tokens=self.content_tokens,
            prompt_tokens=self.prompt_tokens,
            note=self.note(),
        )


class ServerTokenizer:
    """/tokenize and /detokenize of one served model; every failure is one line naming the endpoint."""

    def __init__(self, client: SideClient, base_url: str, model: str) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.model = model

    async def _post(self, path: str, body: JSONObject) -> JSONObject:
        url = self.base_url + path
        answer = await self.client.request(
            "POST", url, body={"model": self.model, **body}, timeout_s=_TIMEOUT_S
        )
        if answer.status == 404:
            raise ServerStatusError(
                f'a random dataset on endpoint = "chat" needs the server\'s /tokenize and /detokenize to '
                f"make prompts of exactly input_len tokens, and POST {url} answered 404; use endpoint = "
                '"completions" (token ids are sent as they are) or a server that has them (vLLM does)',
                status=answer.status,
            )
        if answer.status != 200:
            reason = server_error_message(answer.body, answer.status)
            raise ServerStatusError(
                f"POST {url} answered HTTP {answer.status} ({reason}); a random dataset on "
                'endpoint = "chat" needs it to turn token ids into text',
                status=answer.status,
            )
        return answer.json_object()

    async def tokenize(self, text: str) -> list[int]:
        data = await self._post("/tokenize", {"prompt": text, "add_special_tokens": False})
        return _ids(data.get("tokens"), self.base_url + "/tokenize")

    async def count_chat(self, messages: list[JSONObject]) -> int:
        """What the server will count as prompt tokens for these messages: the chat template applied,
        with the generation prompt, as /v1/chat/completions applies it."""
        body: JSONObject = {"messages": list[JSONValue](messages), "add_generation_prompt": True}
        data = await self._post("/tokenize", body)
        return len(_ids(data.get("tokens"), self.base_url + "/tokenize"))

    async def detokenize(self, ids: list[int]) -> str:
        data = await self._post("/detokenize", {"tokens": list[JSONValue](ids)})
        text = data.get("prompt")
        if not isinstance(text, str):
            raise ServerAnswerError(f"POST {self.base_url}/detokenize answered without a `prompt` string")
        return text


def _ids(value: JSONValue, url: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise ServerAnswerError(f"POST {url} answered without a `tokens` list of integers")
    return [v for v in value if isinstance(v, int)]


async def fit_text(
    tokenizer: ServerTokenizer, ids: list[int], seed: int, index: int, vocab: int
) -> tuple[str, int]:
    """Text of `len(ids)` tokens of the served model, from these ids: (text, its token count), the
    count short of the target only where MAX_ROUND_TRIPS did not settle it."""
    target = len(ids)
    rng = refit_rng(seed, index)
    text = usable_text(await tokenizer.detokenize(ids))
    encoded = await tokenizer.tokenize(text)
    for _ in range(MAX_ROUND_TRIPS):
        if len(encoded) == target:
            break
        text = usable_text(await tokenizer.detokenize(refit_ids(encoded, target, rng, vocab)))
        encoded = await tokenizer.tokenize(text)
    return text, len(encoded)


async def random_chat_prompts(
    client: SideClient,
    base_url: str,
    model: str,
    scenario: Scenario,
    on_prepare: OnPrepare | None = None,
) -> ChatPrompts | None:
    """A token-id dataset (random, trace, prefix_repetition) on the chat endpoint, turned into
    messages by this server's tokenizer; None for any other workload (nothing to do)."""
    dataset = scenario.workload.dataset
    if dataset is None or not dataset.token_prompts or scenario.endpoint != Endpoint.CHAT:
        return None
    tokenizer = ServerTokenizer(client, base_url, model)
    gate = asyncio.Semaphore(_IN_FLIGHT)
    pacer = Pacer("tokenizing prompts", len(dataset.entries), on_prepare)
    done = 0

    async def one(index: int, ids: list[int]) -> tuple[str, int, int]:
        nonlocal done
        async with gate:
            text, count = await fit_text(tokenizer, ids, dataset.seed, index, dataset.vocab_size)
            prompt_tokens = await tokenizer.count_chat([{"role": "user", "content": text}])
        done += 1
        await pacer.step(done)
        return text, count, prompt_tokens

    id_lists = [entry.prompt if isinstance(entry.prompt, list) else [] for entry in dataset.entries]
    fitted = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(id_lists)))
    workload = dataclasses.replace(
        scenario.workload, dataset=dataset.with_chat_texts([text for text, _, _ in fitted])
    )
    return ChatPrompts(
        scenario=dataclasses.replace(scenario, workload=workload),
        input_lens=[len(ids) for ids in id_lists],
        content_tokens=[count for _, count, _ in fitted],
        prompt_tokens=[tokens for _, _, tokens in fitted],
    )
