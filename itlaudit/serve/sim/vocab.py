"""The built-in vocabulary: token ids to bytes and text to token ids, stable across runs."""

from __future__ import annotations

import re
import zlib

from itlaudit.serve.sim.config import SimConfig

BOS_TOKEN_ID = 1  # id 0 is <unk>, which the simulator never emits
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


def token_bytes(token_id: int, config: SimConfig) -> bytes:
    """Special tokens decode to nothing, as with ``skip_special_tokens``."""
    if token_id < FIRST_REGULAR_TOKEN_ID or token_id == config.eos_token_id:
        return b""
    return _PIECES[(token_id - FIRST_REGULAR_TOKEN_ID) % len(_PIECES)]


def tokenize(text: str, config: SimConfig) -> list[int]:
    """Word-level hashing: stable across runs, so prompt_token_ids are reproducible."""
    span = config.vocab_size - FIRST_REGULAR_TOKEN_ID
    ids = [FIRST_REGULAR_TOKEN_ID + zlib.crc32(w.encode()) % span for w in re.findall(r"\s*\S+", text)]
    return [avoid_token(i, {config.eos_token_id}, config) for i in ids] or [BOS_TOKEN_ID]


def avoid_token(token_id: int, banned: set[int], config: SimConfig) -> int:
    """Deterministic substitute for a masked token (the min_tokens logits processor, or EOS in a
    prompt) that consumes no randomness, so the rest of the sequence is unchanged."""
    span = config.vocab_size - FIRST_REGULAR_TOKEN_ID
    while token_id in banned:
        token_id = FIRST_REGULAR_TOKEN_ID + (token_id - FIRST_REGULAR_TOKEN_ID + 1) % span
    return token_id
