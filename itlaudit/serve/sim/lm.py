"""The simulator's language model: a fixed bigram distribution over its vocabulary.

The default simulator draws every token uniformly, so every output is exactly as likely as any
other and a distribution audit has nothing to measure. With `SimConfig.model_sharpness` > 0 the next
token follows softmax(sharpness · z[prev] / temperature), z[prev] a fixed standard-normal logit row per
previous token, so sampled outputs have a likelihood under the model, prompt_logprobs can score it
(at temperature 1, as vLLM's raw prompt logprobs are), and a broken speculative sampler (accepted
drafts from the wrong distribution: `SimConfig.draft_sampler`) shifts that likelihood measurably.

The rows depend on the served model name only, never on the sampling seed: two simulators with
different seeds serve the same model, as two replicas of one checkpoint do.
"""

from __future__ import annotations

import random
import zlib

import numpy as np

from itlaudit.serve.sim.config import ARGMAX, FLAT, MODEL, SimConfig
from itlaudit.serve.sim.vocab import FIRST_REGULAR_TOKEN_ID


class BigramModel:
    """Next-token log-probabilities given the previous token; EOS and the special ids are never drawn."""

    def __init__(self, config: SimConfig) -> None:
        self.sharpness = config.model_sharpness
        self.size = config.vocab_size
        self.banned = [t for t in range(self.size) if t < FIRST_REGULAR_TOKEN_ID or t == config.eos_token_id]
        self.salt = zlib.crc32(config.model.encode())
        self._logits: dict[int, np.ndarray] = {}

    def logits(self, prev: int) -> np.ndarray:
        """The fixed logit row after `prev` (cached: at most vocab_size rows of vocab_size floats)."""
        row = self._logits.get(prev)
        if row is None:
            rng = np.random.default_rng([self.salt, prev % self.size])
            row = self.sharpness * rng.standard_normal(self.size)
            row[self.banned] = -np.inf
            self._logits[prev] = row
        return row

    def _probs(self, prev: int, temperature: float) -> np.ndarray:
        scaled = self.logits(prev) / temperature
        weights = np.exp(scaled - scaled.max())
        probs: np.ndarray = weights / weights.sum()
        return probs

    def logprob(self, prev: int, token: int) -> float:
        """log p(token | prev) at temperature 1: what a prompt_logprobs scoring reports."""
        row = self.logits(prev)
        top = row.max()
        return float(row[token] - top - np.log(np.exp(row - top).sum()))

    def rank(self, prev: int, token: int) -> int:
        """vLLM's rank: 1 for the most likely token."""
        row = self.logits(prev)
        return int((row > row[token]).sum()) + 1

    def draw(self, prev: int, temperature: float, rng: random.Random, sampler: str = MODEL) -> int:
        """One token: one uniform draw from `rng` whatever the sampler, so a fault changes the token at
        a position and nothing after it in the random stream."""
        u = rng.random()
        if sampler == ARGMAX or (sampler == MODEL and temperature == 0):
            return int(np.argmax(self.logits(prev)))
        if sampler == FLAT:
            allowed = np.isfinite(self.logits(prev))
            return int(np.flatnonzero(allowed)[min(int(u * allowed.sum()), int(allowed.sum()) - 1)])
        cdf = np.cumsum(self._probs(prev, temperature))
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), self.size - 1))
