"""The engine: one request's tokens step by step, with spec-decode acceptance, stop checks and faults."""

from __future__ import annotations

import asyncio
import codecs
import itertools
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.serve.sim.config import MODEL, SimConfig
from itlaudit.serve.sim.lm import BigramModel
from itlaudit.serve.sim.load import Load, RequestSpecMetrics
from itlaudit.serve.sim.vocab import DIGIT_TOKEN_ID, FIRST_REGULAR_TOKEN_ID, avoid_token, token_bytes


@dataclass
class Job:
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
    prompt_logprobs: int | None = None


@dataclass
class TokenLogprob:
    """One sampled token's logprob entry, with token strings already rendered as the API shows them,
    and the same candidates by id (best first) for SGLang's /generate, which sends ids."""

    token: str
    logprob: float
    top: dict[str, float]
    token_id: int = 0
    ranked: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Step:
    """What one engine step hands to the serving layer: the tokens accepted in that step."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    stop_reason: int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    due_ns: int = 0  # when the schedule says this step's chunk leaves (CLOCK_MONOTONIC)
    spec_decode: RequestSpecMetrics | None = None  # on the final step, with K > 0


@dataclass
class _SpecDecodeCounters:
    """Cumulative over the server's life, like vLLM's Prometheus counters."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


async def _sleep_until(due_ns: int) -> None:
    await asyncio.sleep(max(0.0, (due_ns - time.monotonic_ns()) / 1e9))


class Engine:
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
        self.load = Load(config.max_num_seqs, config.kv_cache_tokens)
        # Scores prompts always (uniform at sharpness 0); draws tokens only at sharpness > 0.
        self.lm = BigramModel(config)

    def _request_seed(self, job: Job) -> str:
        if job.seed is not None:
            return f"seed-{job.seed}"
        if job.temperature == 0:
            # Greedy: the output depends only on the prompt, as with a real model.
            return f"greedy-{self.config.seed}-{job.prompt_token_ids}"
        return f"random-{self.rng.getrandbits(64)}"

    async def generate(self, job: Job) -> AsyncGenerator[Step, None]:
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
        prev = job.prompt_token_ids[-1]
        request_spec = RequestSpecMetrics(cfg.num_speculative_tokens)
        # Steps are due at absolute times (prefill + n steps after arrival), so time spent writing and
        # waking up late does not accumulate: a "5 ms" server delivers one step per 5 ms on average.
        # After a stall (the process was starved) steps catch up at half a step apart, never in a
        # burst that would land the missed steps in one read. The decode grid starts when the prefill
        # step is actually released, as a real engine's decode starts when its prefill ends: 64 first
        # chunks due at once leave over ~10 ms on a loaded 2-core box, and a grid anchored at their due
        # time compressed the late ones' token ITL by that much (9.88 ms for a "10 ms" step). The send
        # log's first due time is that release.
        scheduled_ns = due_ns = time.monotonic_ns() + round(cfg.ttft_ms * 1e6)
        await _sleep_until(due_ns)
        scheduled_ns = due_ns = max(due_ns, time.monotonic_ns())
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
                request_spec.observe(num_drafts, accepted)

            step = Step(token_ids=[], text="", due_ns=due_ns)
            for slot in range(accepted + 1):
                index = produced
                # One draw per position whatever happens to it, so EOS placement and masking leave
                # the rest of the sequence unchanged. The first `accepted` tokens are accepted drafts.
                drawn = self._draw(job, prev, token_rng, draft=slot < accepted)
                token_id = cfg.eos_token_id if index == cfg.natural_eos_at else drawn
                if cfg.gibberish_after_tokens is not None and index >= cfg.gibberish_after_tokens:
                    token_id = DIGIT_TOKEN_ID
                if index < min_tokens:
                    token_id = avoid_token(token_id, masked, cfg)
                produced += 1
                prev = token_id
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
            self.load.grow(job, len(step.token_ids))
            if step.finish_reason:
                self.finished[step.finish_reason] += 1
                step.spec_decode = request_spec if cfg.num_speculative_tokens else None
            yield step
            if step.finish_reason:
                return
            step_ns = round(self._step_ms() * 1e6)
            scheduled_ns += step_ns
            due_ns = max(scheduled_ns, time.monotonic_ns() + step_ns // 2)
            await _sleep_until(due_ns)

    def _draw(self, job: Job, prev: int, rng: random.Random, *, draft: bool) -> int:
        """The next token: uniform without a model (the default, temperature ignored), else from the
        model, an accepted draft from the configured draft sampler (a fault unless it is the model)."""
        cfg = self.config
        if cfg.model_sharpness <= 0:
            return avoid_token(rng.randrange(FIRST_REGULAR_TOKEN_ID, cfg.vocab_size), {cfg.eos_token_id}, cfg)
        return self.lm.draw(prev, job.temperature, rng, cfg.draft_sampler if draft else MODEL)

    def prompt_logprobs(self, job: Job) -> list[JSONValue] | None:
        """vLLM's prompt_logprobs: None for the first prompt token, then per position the prompt token
        and the model's top `prompt_logprobs` candidates, each {logprob, rank, decoded_token}."""
        k = job.prompt_logprobs
        if k is None:
            return None
        ids = job.prompt_token_ids
        out: list[JSONValue] = [None]
        for prev, token in itertools.pairwise(ids):
            ranked = [int(t) for t in (-self.lm.logits(prev)).argsort(kind="stable")[:k]]
            position: JSONObject = {str(t): self._prompt_entry(job, prev, t) for t in [token, *ranked]}
            out.append(position)
        return out

    def _prompt_entry(self, job: Job, prev: int, token: int) -> JSONObject:
        shown = (
            f"token_id:{token}"
            if job.return_tokens_as_token_ids
            else token_bytes(token, self.config).decode("utf-8", errors="replace")
        )
        return {
            "logprob": self.lm.logprob(prev, token),
            "rank": self.lm.rank(prev, token),
            "decoded_token": shown,
        }

    def _step_ms(self) -> float:
        """One decode step at the engine's current batch (the rows in flight now)."""
        cfg = self.config
        per_row = cfg.batch_slowdown_ms_per_stream
        if cfg.num_speculative_tokens:
            per_row += cfg.spec_verify_ms_per_stream
        return cfg.step_ms + per_row * max(self.in_flight - 1, 0)

    def _token_logprob(self, job: Job, k: int, position_seed: str, token_id: int) -> TokenLogprob:
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
        by_id = [(tok, values[tok]) for tok in best]
        return TokenLogprob(render(token_id), values[token_id], top, token_id, by_id)

    def _observe_spec(self, num_drafts: int, accepted: int) -> None:
        self.spec.num_drafts += 1
        self.spec.num_draft_tokens += num_drafts
        self.spec.num_accepted_tokens += accepted
        for pos in range(accepted):
            self.spec.accepted_per_pos[pos] += 1
