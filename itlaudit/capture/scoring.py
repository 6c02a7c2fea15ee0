"""Non-streaming scoring requests for the invariance, lossless and distribution audits (I/O only;
figures elsewhere).

Scoring asks for one token with `logprobs=k` at temperature 0: the logprobs of that first position are
a pure function of the prompt and the engine step it was computed in, which is what batch invariance
is about. A prompt *list* is the only way to force rows into one engine step over HTTP: vLLM submits
every prompt of one request before its engine core takes the next step.

The distribution audit asks something else: how likely a sampled output is under the K0 server. It
sends prompt + output as token ids with `prompt_logprobs=0` and `max_tokens=1`, and reads each output
position's logprob of the token that is there (vLLM's raw logprobs: temperature does not apply).

SGLang speaks another dialect (`SGLangScorer`, chosen by `scorer_for` from the server's identity):
its /v1/completions keys candidates by token text and ignores `return_tokens_as_token_ids` and
`prompt_logprobs`, so it is scored on its native /generate, which gives ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from itlaudit.analysis.distribution import ScoredOutput
from itlaudit.analysis.invariance import (
    DEFAULT_SWEEP_SIZES,
    PromptObservations,
    TopLogprobs,
    parse_generate_top_logprobs,
    parse_top_logprobs,
)
from itlaudit.analysis.lossless import output_token_ids, with_divergence_logprobs
from itlaudit.capture.request_plan import Prompt
from itlaudit.errors import ItlauditError, ServerRejectedError
from itlaudit.model.codes import Finding
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_context import is_sglang
from itlaudit.model.vocabulary import Endpoint

if TYPE_CHECKING:
    from itlaudit.side.client import SideClient

DEFAULT_REPEATS = 40
DEFAULT_TOP_K = 20
# Scoring requests in flight at once: enough to keep a server's batch busy, few enough not to queue
# behind each other into the timeout on a 2-core CPU testbed.
SCORING_CONCURRENCY = 4


@dataclass(frozen=True)
class Scorer:
    """Where and how to score: one server, one model, top-k candidates per position; vLLM's
    /v1/completions (SGLangScorer speaks SGLang's /generate)."""

    client: SideClient
    base_url: str
    model: str
    top_k: int = DEFAULT_TOP_K
    timeout_s: float = 120.0
    extra_body: JSONObject = field(default_factory=dict)

    async def complete(
        self, prompt: str | list[str] | list[int], max_tokens: int, **overrides: Any
    ) -> JSONObject:
        """One greedy non-streaming completion with top-k logprobs keyed by token id (the server's
        answer, unchecked)."""
        body: JSONObject = {
            "model": self.model,
            "prompt": list[JSONValue](prompt) if isinstance(prompt, list) else prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": self.top_k,
            "return_tokens_as_token_ids": True,
            **self.extra_body,
            **overrides,
        }
        url = self.base_url.rstrip("/") + Endpoint.COMPLETIONS.path
        return await self.client.post_json(url, body, timeout_s=self.timeout_s)

    async def candidates(
        self, prompts: list[str], max_tokens: int, *, ignore_eos: bool = False
    ) -> list[list[TopLogprobs]]:
        """Per prompt of the list (all rows in one request), per position of its greedy continuation,
        the top-k candidates by id."""
        extra: JSONObject = {"ignore_eos": True} if ignore_eos else {}
        return parse_top_logprobs(await self.complete(prompts, max_tokens, **extra))

    async def score(self, prompts: list[str]) -> list[TopLogprobs]:
        """Position-0 candidates of each prompt in the list, all rows in one request."""
        return [positions[0] for positions in await self.candidates(prompts, 1)]

    async def top_logprobs_at(self, prompt: str, position: int) -> TopLogprobs:
        """The candidates at one output position of the greedy continuation of `prompt`. ignore_eos
        cannot change a greedy prefix, and keeps an early EOS from ending it before `position`."""
        positions = (await self.candidates([prompt], position + 1, ignore_eos=True))[0]
        if len(positions) <= position:
            raise ServerRejectedError(
                f"the greedy continuation ended after {len(positions)} tokens, before position {position}"
            )
        return positions[position]

    async def prompt_token_ids(self, prompt: str) -> list[int]:
        """The ids the server tokenizes `prompt` into (its BOS included), as it did for the run."""
        body = await self.complete(prompt, 1, logprobs=None, return_token_ids=True)
        ids = _first_choice(body).get("prompt_token_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ServerRejectedError(
                f"{self.base_url} returned no prompt_token_ids for return_token_ids: true; the "
                "distribution audit needs a vLLM that returns them (0.10.2 or later)"
            )
        return [t for t in ids if isinstance(t, int)]

    async def output_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """log p of each output token given the prompt and the output before it, from the server's
        prompt_logprobs over prompt + output."""
        body = await self.complete([*prompt_ids, *output_ids], 1, logprobs=None, prompt_logprobs=0)
        rows = _first_choice(body).get("prompt_logprobs")
        ids = [*prompt_ids, *output_ids]
        if not isinstance(rows, list) or len(rows) != len(ids):
            raise ServerRejectedError(
                f"{self.base_url} answered prompt_logprobs: 0 without one entry per prompt token; the "
                "distribution audit scores outputs with it"
            )
        try:
            return [_logprob(rows[pos], ids[pos]) for pos in range(len(prompt_ids), len(ids))]
        except (KeyError, TypeError, ValueError):
            raise ServerRejectedError(
                f"{self.base_url}: a prompt_logprobs entry lacks its own token's logprob"
            ) from None


@dataclass(frozen=True)
class SGLangScorer(Scorer):
    """SGLang's dialect (0.5.12's sources, python/sglang/srt/managers/io_struct.py GenerateReqInput and
    tokenizer_manager.py): /generate with `return_logprob` and `top_logprobs_num`, a `text` list for
    rows in one request (a batch, sent to the scheduler together, as its /v1/completions does with a
    prompt list), and `logprob_start_len` for the prompt's own logprobs (`input_token_logprobs`:
    [logprob, token_id, text] from that position on, the first logprob None)."""

    async def generate(
        self,
        prompt: str | list[str] | list[int],
        max_new_tokens: int,
        *,
        ignore_eos: bool = False,
        **fields: Any,
    ) -> JSONValue:
        """One greedy non-streaming /generate (the server's answer, unchecked: an object, or a list for
        a `text` list)."""
        sampling: JSONObject = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": ignore_eos}
        given = list[JSONValue](prompt) if isinstance(prompt, list) else prompt
        ids = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
        body: JSONObject = {
            ("input_ids" if ids else "text"): given,
            "sampling_params": sampling,
            "return_logprob": True,
            "top_logprobs_num": self.top_k,
            **self.extra_body,
            **fields,
        }
        url = self.base_url.rstrip("/") + "/generate"
        answer = await self.client.request("POST", url, body=body, timeout_s=self.timeout_s)
        return answer.checked().json()

    async def candidates(
        self, prompts: list[str], max_tokens: int, *, ignore_eos: bool = False
    ) -> list[list[TopLogprobs]]:
        return parse_generate_top_logprobs(await self.generate(prompts, max_tokens, ignore_eos=ignore_eos))

    async def prompt_token_ids(self, prompt: str) -> list[int]:
        ids = [token for _, token in await self._input_logprobs(prompt, 0)]
        if not ids:
            raise ServerRejectedError(
                f"{self.base_url}: /generate returned no input_token_logprobs for the prompt"
            )
        return ids

    async def output_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        # From the prompt's last token on: its entry has no logprob, each after it is an output token's.
        entries = (await self._input_logprobs([*prompt_ids, *output_ids], len(prompt_ids) - 1))[1:]
        if [token for _, token in entries] != output_ids or any(lp is None for lp, _ in entries):
            raise ServerRejectedError(
                f"{self.base_url}: /generate's input_token_logprobs from logprob_start_len on are not the "
                "output's tokens with their logprobs; the distribution audit scores outputs with them"
            )
        return [float(lp) for lp, _ in entries if lp is not None]

    async def _input_logprobs(self, prompt: str | list[int], start: int) -> list[tuple[float | None, int]]:
        """The prompt's (logprob, token id) from position `start` on, as SGLang sends them."""
        body = await self.generate(prompt, 1, top_logprobs_num=0, logprob_start_len=start)
        meta = body.get("meta_info") if isinstance(body, dict) else None
        entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
        out: list[tuple[float | None, int]] = []
        for entry in entries if isinstance(entries, list) else []:
            logprob, token = (
                (entry[0], entry[1]) if isinstance(entry, list) and len(entry) >= 2 else (0, None)
            )
            if not isinstance(token, int) or not isinstance(logprob, int | float | None):
                raise ServerRejectedError(
                    f"{self.base_url}: an input_token_logprobs entry is not [logprob, id, text]"
                )
            out.append((None if logprob is None else float(logprob), token))
        return out


async def scorer_for(client: SideClient, base_url: str, model: str, *, top_k: int = DEFAULT_TOP_K) -> Scorer:
    """The scorer that speaks the server's dialect: SGLang's where the server says it is SGLang
    (SideClient.version reads its /server_info), vLLM's otherwise, a server that does not say included."""
    try:
        version = await client.version(base_url)
    except ItlauditError:
        version = None
    kind = SGLangScorer if is_sglang(version) else Scorer
    return kind(client, base_url, model, top_k=top_k)


def _logprob(row: JSONValue, token: int) -> float:
    """One prompt_logprobs entry's logprob of `token`; TypeError/KeyError/ValueError when it has none."""
    if not isinstance(row, dict):
        raise TypeError("a prompt_logprobs entry is not an object")
    entry = row[str(token)]
    if not isinstance(entry, dict):
        raise TypeError("a prompt_logprobs candidate is not an object")
    value = entry["logprob"]
    if not isinstance(value, (int, float, str)):
        raise TypeError("a logprob is not a number")
    return float(value)


def _first_choice(body: JSONObject) -> JSONObject:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerRejectedError(f"a scoring response without choices: {str(body)[:100]}")
    return choices[0]


async def score_outputs(
    scorer: Scorer,
    records: Sequence[RequestRecord],
    prompt_of: Callable[[RequestRecord], Prompt],
) -> list[ScoredOutput]:
    """Each record's output scored under `scorer`'s server, after the prompt it followed (text is
    tokenized by that server, once per distinct prompt; token ids are taken as they are). Left out:
    a chat prompt (messages have no token ids to score after), and a record whose prompt does not come
    to the length the run's server reported (it was not sent as `prompt_of` says)."""
    prompt_ids: dict[str, list[int]] = {}
    for prompt in dict.fromkeys(p for p in map(prompt_of, records) if isinstance(p, str)):
        prompt_ids[prompt] = await scorer.prompt_token_ids(prompt)
    gate = asyncio.Semaphore(SCORING_CONCURRENCY)

    def ids_of(prompt: Prompt) -> list[int] | None:
        if isinstance(prompt, str):
            return prompt_ids[prompt]
        ids = [t for t in prompt if isinstance(t, int)]
        return ids if len(ids) == len(prompt) else None

    async def one(record: RequestRecord) -> ScoredOutput | None:
        ids, output = ids_of(prompt_of(record)), output_token_ids(record)
        if not ids or not output or (record.prompt_tokens is not None and record.prompt_tokens != len(ids)):
            return None
        async with gate:
            return ScoredOutput(record, tuple(await scorer.output_logprobs(ids, output)))

    return [s for s in await asyncio.gather(*(one(r) for r in records)) if s is not None]


async def explain_mismatch(finding: Finding, prompt: str, base: Scorer, spec: Scorer) -> Finding:
    """A spec_decode_output_mismatch plus both servers' top logprobs at the differing token, re-scored
    on each server (greedy, so the prefix is reproduced); a text-only mismatch is returned unchanged."""
    position = finding.evidence.get("position")
    if finding.evidence.get("unit") != "token" or not isinstance(position, int):
        return finding
    base_top, spec_top = await asyncio.gather(
        base.top_logprobs_at(prompt, position), spec.top_logprobs_at(prompt, position)
    )
    return with_divergence_logprobs(finding, base_top, spec_top)


async def observe(
    scorer: Scorer,
    prompt: str,
    repeats: int = DEFAULT_REPEATS,
    *,
    concurrent: bool = False,
    sweep_sizes: Sequence[int] = DEFAULT_SWEEP_SIZES,
) -> PromptObservations:
    """The seed's four scorings of one prompt (alone ×N, batch of 2 ×N), optionally two concurrent
    requests ×N (step sharing left to timing), then one list per sweep size. Sequential on purpose:
    only the rows we place together may share a step."""
    alone = [(await scorer.score([prompt]))[0] for _ in range(repeats)]
    batch2 = [await scorer.score([prompt, prompt]) for _ in range(repeats)]
    pairs = []
    if concurrent:
        for _ in range(repeats):
            first, second = await asyncio.gather(scorer.score([prompt]), scorer.score([prompt]))
            pairs.append([first[0], second[0]])
    sweep = {size: await scorer.score([prompt] * size) for size in sweep_sizes}
    return PromptObservations(prompt=prompt, alone=alone, batch2=batch2, concurrent=pairs, sweep=sweep)
