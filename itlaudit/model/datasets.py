"""[workload.dataset]: the requests a workload draws from, read and drawn up front, pure.

Three kinds, after vllm bench serve's datasets:

- `random`: prompts of exactly `input_len` token ids, sent as a token-id list on /v1/completions so the
  server sees that many prompt tokens without itlaudit needing a tokenizer; `output_len` becomes
  max_tokens with ignore_eos, so every request generates exactly that many. Each length is fixed, a
  uniform range `{ min, max }` or a normal `{ mean, std }` (rounded, at least 1), drawn from `seed`.
  Chat takes no token ids: when the run starts the server's /detokenize turns each entry into text and
  its /tokenize checks that the text is still `input_len` tokens (`itlaudit.capture.tokenizer`, with
  `refit_ids` below doing the correction between round trips, as vllm bench serve does); the message
  then holds exactly `input_len` tokens, and the chat template adds its own on top.
- `jsonl`: one object per line, `prompt` (completions) or `messages` (chat), optional `max_tokens` and
  `category`.
- `sharegpt`: the ShareGPT layout (a JSON list of `{"conversations": [{"from": "human", ...}, ...]}`):
  the first human turn is the prompt, the reply after it sets max_tokens: counted by the server's
  /tokenize when the run starts (`itlaudit.capture.runner`), else estimated at ~4 characters per token with a
  warning (the estimate is what the entry holds until then).

- `multi_turn`: ShareGPT conversations as sessions (chat only): turn k is sent with the conversation's
  turns before it (the recorded replies as the assistant's, so every body is built before the run),
  after turn k-1's reply has ended and `think_time_s` more; a session's turns go to one capture
  worker, in order (`itlaudit.capture.workers`). Each turn's category is `turn k`, so the report's
  per-category figures are per turn index. `max_turns` cuts longer conversations.
- `trace`: a timed trace, one JSON object per line, read as it is in the mooncake format (`timestamp`
  in ms, `input_length`, `output_length`, `hash_ids`: one id per 512-token block) or vLLM's
  `timed_trace` (the same keys, `timestamp` in seconds, 16-token blocks); a line may hold a `text`
  (or `prompt`) instead of `input_length`. Each hash id stands for one block of token ids drawn from
  the seed and that id, so lines that share leading hash ids share that prompt prefix, as the
  recorded requests did; a prompt longer than its blocks is topped up with ids of its own. Each
  entry keeps its due time (the schedule is the trace's: `itlaudit.model.schedule`).
- `prefix_repetition`: vLLM's dataset of that name, `num_prefixes` prefixes of `prefix_len` token ids,
  each followed by `num_requests // num_prefixes` suffixes of `suffix_len`, shuffled from the seed.
- `spec_bench`: SpecBench's question.jsonl (`category`, `turns`: the first turn is the prompt).
- `speed_bench`: SPEED-Bench's folder as NeMo-Skills' prepare script writes it, one `<subset>.jsonl`
  per subset (`category`, `messages`: the first message's content is the prompt).
  Both take `category` (one name or a list) to keep only those, and `output_len` as max_tokens.

`num_requests` draws entries in order, cycling.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import msgspec

from itlaudit.errors import DatasetError
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.scenario_toml import SEQUENCE_TOKENS, TOKEN_ID, Bound

if TYPE_CHECKING:
    import numpy as np

DATASET_KINDS = (
    "random",
    "jsonl",
    "sharegpt",
    "multi_turn",
    "trace",
    "prefix_repetition",
    "spec_bench",
    "speed_bench",
)
TOKEN_ID_KINDS = ("random", "trace", "prefix_repetition")  # kinds whose prompts may be token-id lists
REPLY_KINDS = ("sharegpt", "multi_turn")  # kinds whose max_tokens is a recorded reply's length
# A trace's formats: (seconds per timestamp unit, tokens per hash id block), as each source writes them.
TRACE_FORMATS = {"mooncake": (0.001, 512), "timed_trace": (1.0, 16)}
SPEED_BENCH_SUBSETS = (
    "qualitative",
    "throughput_1k",
    "throughput_2k",
    "throughput_8k",
    "throughput_16k",
    "throughput_32k",
)
CHARS_PER_TOKEN = 4  # the usual estimate for English text under BPE tokenizers
FIRST_TOKEN_ID = 3  # ids 0-2 are special (unk/bos/eos) in most vocabularies
DEFAULT_VOCAB_SIZE = 256  # every BPE vocabulary has at least its 256 byte tokens
VOCAB_SIZE = Bound(FIRST_TOKEN_ID + 2, TOKEN_ID.hi, integer=True)
# The range of each numeric [workload.dataset] key past the lengths above (docs/scenarios.md "Bounds").
DATASET_BOUNDS: dict[str, Bound] = {
    "vocab_size": VOCAB_SIZE,
    "prefix_len": SEQUENCE_TOKENS,
    "suffix_len": SEQUENCE_TOKENS,
    "output_len": SEQUENCE_TOKENS,
    "num_prefixes": Bound(1, 1_000_000, integer=True),
    "block_tokens": Bound(1, 1_000_000, integer=True),
    "max_turns": Bound(1, 1_000_000, integer=True),
    "think_time_s": Bound(0, 3600, unit="s"),
}
# A random dataset's prompts are drawn up front and held as Python lists (8 bytes a token, ~36 above
# id 256) until each is encoded: 20M tokens (1000 requests of 20K) is ~1 GB at worst, and takes about
# 0.5 us a token from the draw to the encoded bodies. Above it the scenario is refused before
# anything is drawn. A trace's hash blocks (`block_tokens` ids each, held for every line that shares
# them) and a multi-turn file's histories (each turn's body repeats the turns before it) count too.
MAX_DRAWN_TOKENS = 20_000_000


@dataclass(frozen=True)
class DatasetEntry:
    """One request's input: a text prompt, a token-id prompt or chat messages, and its own limits."""

    prompt: str | list[int] | None = None
    messages: list[JSONObject] | None = None  # chat messages as the dataset gives them
    max_tokens: int | None = None
    ignore_eos: bool | None = None  # None: the workload's setting
    category: str | None = None
    reply: str | None = None  # sharegpt: the reply whose token count becomes max_tokens
    timestamp_s: float | None = None  # trace: when it is due, in seconds from the trace's first line
    session: int | None = None  # multi_turn: the conversation this turn belongs to
    turn: int | None = None  # multi_turn: 1 for a conversation's first turn

    def text(self) -> str:
        """A readable form (the prompt text, the last message, or the ids) for where a string is needed.
        The ids are written as json.dumps writes them ("[3, 17]"), through msgspec: ~4x faster on the
        long prompts of a large random dataset, and the same text (the ledger's fingerprint hashes it)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if self.messages:
            return str(self.messages[-1].get("content", ""))
        return msgspec.json.encode(self.prompt).replace(b",", b", ").decode()


@dataclass(frozen=True)
class Dataset:
    kind: str
    entries: list[DatasetEntry]
    warning: str | None = None
    seed: int = 0  # random: what the ids were drawn from, and the ids a chat round trip adds
    vocab_size: int = DEFAULT_VOCAB_SIZE  # random: ids are drawn from [FIRST_TOKEN_ID, vocab_size)
    think_time_s: float = 0.0  # multi_turn: the pause after a turn's reply before the next turn

    @property
    def token_prompts(self) -> bool:
        """Every prompt is a token-id list: on chat the server's tokenizer turns them into text first."""
        return self.kind in TOKEN_ID_KINDS and all(isinstance(e.prompt, list) for e in self.entries)

    def trace_s(self) -> tuple[float, ...] | None:
        """A trace's due times in seconds from its first line; None for any other dataset."""
        if self.kind != "trace":
            return None
        return tuple(e.timestamp_s or 0.0 for e in self.entries)

    def with_chat_texts(self, texts: list[str]) -> Dataset:
        """A random dataset's entries as one user message each (the text of its ids), for chat."""
        entries = [
            replace(entry, prompt=None, messages=[{"role": "user", "content": text}])
            for entry, text in zip(self.entries, texts, strict=True)
        ]
        return replace(self, entries=entries)


def _within(value: float, key: str, part: str, bound: Bound) -> None:
    problem = bound.problem(value)
    if problem is not None:
        raise DatasetError(key, f"{part}{problem}")


def _length(spec: Any, key: str, rng: np.random.Generator, count: int) -> list[int]:
    """A fixed length, `{ min, max }` (uniform, inclusive) or `{ mean, std }` (normal), each number
    within SEQUENCE_TOKENS (a normal draw is also cut to it)."""
    how = f"`{key}` must be a positive integer, {{ min = 8, max = 64 }} or {{ mean = 32, std = 8 }}"
    if isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        _within(spec, key, "", SEQUENCE_TOKENS)
        return [spec] * count
    if isinstance(spec, dict) and set(spec) == {"min", "max"}:
        low, high = spec["min"], spec["max"]
        if not (isinstance(low, int) and isinstance(high, int) and 0 < low <= high):
            raise DatasetError(key, f"{how}; got {spec!r}")
        _within(high, key, "max ", SEQUENCE_TOKENS)
        return [int(v) for v in rng.integers(low, high + 1, size=count)]
    if isinstance(spec, dict) and set(spec) == {"mean", "std"}:
        mean, std = spec["mean"], spec["std"]
        if not (isinstance(mean, int | float) and isinstance(std, int | float) and mean > 0 and std >= 0):
            raise DatasetError(key, f"{how}; got {spec!r}")
        _within(mean, key, "mean ", SEQUENCE_TOKENS)
        _within(std, key, "std ", Bound(0, SEQUENCE_TOKENS.hi))
        import numpy as np

        drawn = np.clip(np.rint(rng.normal(mean, std, size=count)), 1, SEQUENCE_TOKENS.hi)
        return [int(v) for v in drawn]
    raise DatasetError(key, f"{how}; got {spec!r}")


def random_dataset(table: Mapping[str, object], count: int, seed: int) -> Dataset:
    unknown = set(table) - {"kind", "input_len", "output_len", "vocab_size", "prefix_len"}
    if unknown:
        raise DatasetError(
            sorted(unknown)[0],
            "is not a key of a random dataset (input_len, output_len, vocab_size, prefix_len)",
        )
    for key in ("input_len", "output_len"):
        if key not in table:
            raise DatasetError(key, "is missing; a random dataset needs input_len and output_len")
    vocab = table.get("vocab_size", DEFAULT_VOCAB_SIZE)
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise DatasetError("vocab_size", f"must be an integer, got {vocab!r}")
    _within(vocab, "vocab_size", "", VOCAB_SIZE)
    import numpy as np  # numpy loads when a dataset is drawn, not when the CLI starts

    rng = np.random.default_rng(seed)
    given = table.get("prefix_len", 0)
    prefix_len = (
        0 if given == 0 and type(given) is int else _dataset_number(table, "prefix_len")
    )  # 0: vllm's default
    inputs = _length(table["input_len"], "input_len", rng, count)
    outputs = _length(table["output_len"], "output_len", rng, count)
    # vllm bench's --random-prefix-len: one random prefix before every prompt (the server's prefix
    # cache sees it shared); a prompt is prefix_len + its input_len tokens, as vllm bench counts it.
    prefix = rng.integers(FIRST_TOKEN_ID, vocab, size=prefix_len).tolist() if prefix_len else []
    drawn = sum(inputs) + prefix_len * count
    if drawn > MAX_DRAWN_TOKENS:
        raise DatasetError(
            "input_len",
            f"draws {drawn} prompt tokens over {count} requests, above the {MAX_DRAWN_TOKENS} a run "
            "builds up front; send fewer requests or shorter prompts",
        )
    # One draw per entry, turned into a list in C: linear in the tokens, and a Ctrl-C is seen between
    # entries (a per-id Python loop took 185 s for a 1e9-token prompt, deaf to SIGINT).
    entries = [
        DatasetEntry(
            prompt=prefix + rng.integers(FIRST_TOKEN_ID, vocab, size=n_in).tolist(),
            max_tokens=n_out,
            ignore_eos=True,
        )
        for n_in, n_out in zip(inputs, outputs, strict=True)
    ]
    return Dataset("random", entries, seed=seed, vocab_size=vocab)


MAX_ROUND_TRIPS = 10  # vllm bench serve's retry budget for the same correction


def refit_ids(encoded: list[int], target: int, rng: np.random.Generator, vocab_size: int) -> list[int]:
    """Decoded text does not always re-encode to as many tokens as it was decoded from (BPE merges
    across the old boundaries, invalid UTF-8 becomes U+FFFD): the re-encoding, cut to `target` or
    topped up with fresh ids, is what the next round trip decodes."""
    if len(encoded) >= target:
        return encoded[:target]
    extra = rng.integers(FIRST_TOKEN_ID, vocab_size, size=target - len(encoded))
    return encoded + [int(t) for t in extra]


def usable_text(decoded: str) -> str:
    """Random ids include stray bytes of multi-byte characters: they decode to U+FFFD, which encodes
    back as three byte tokens, and a cut through those decodes to U+FFFD again, so the length would
    never settle. Dropped here, the next round trip's top-up restores the count."""
    return decoded.replace("\ufffd", "")


def refit_rng(seed: int, index: int) -> np.random.Generator:
    """Entry `index`'s own generator for the ids a round trip adds, so the texts depend on the seed
    and the server's tokenizer only, not on the order the round trips finish in."""
    import numpy as np

    return np.random.default_rng([seed, index])


def chat_prompt_note(input_lens: list[int], content_tokens: list[int], prompt_tokens: list[int]) -> str:
    """One line on what a chat random dataset's prompts are: message tokens against input_len, and
    what the chat template adds (the server counts these as usage.prompt_tokens)."""
    added = sorted({p - c for p, c in zip(prompt_tokens, content_tokens, strict=True)})
    off = sum(c != n for c, n in zip(content_tokens, input_lens, strict=True))
    exact = (
        "each message is exactly its input_len tokens"
        if not off
        else f"{off} of {len(input_lens)} messages missed their input_len after {MAX_ROUND_TRIPS} round trips"
    )
    template = f"{added[0]}" if len(added) == 1 else f"{added[0]}-{added[-1]}"
    return (
        f"random prompts on chat: {exact} (the server's /detokenize and /tokenize); the chat template "
        f"adds {template} tokens, so the server counts {min(prompt_tokens)}-{max(prompt_tokens)} "
        "prompt tokens per request (records' prompt_tokens)"
    )


def _read(path: Path) -> str:
    if path.is_dir():
        raise DatasetError("path", f"names {path}, which is a folder; name the dataset file in it")
    if not path.is_file():
        raise DatasetError("path", f"names {path}, which does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError("path", f"names {path}, which cannot be read as UTF-8 text ({exc})") from None


def _positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _token_count(value: object) -> int | None:
    """A length in tokens as a dataset line gives it, or None where it is not one within SEQUENCE_TOKENS."""
    return value if _positive_int(value) and SEQUENCE_TOKENS.problem(value) is None else None


def jsonl_dataset(path: Path, chat: bool) -> Dataset:
    entries = []
    for where, obj in _json_lines(path):
        prompt, given = obj.get("prompt"), obj.get("messages")
        listed = given if isinstance(given, list) else []
        messages = [m for m in listed if isinstance(m, dict)] or None
        if messages is not None and len(messages) == len(listed):
            if not chat:
                raise DatasetError("path", f'{where} has `messages`, which need endpoint = "chat"')
        elif isinstance(prompt, str) and prompt:
            messages = None
        else:
            raise DatasetError("path", f"{where} needs a non-empty `prompt` string or a `messages` list")
        max_tokens, category = obj.get("max_tokens"), obj.get("category")
        if max_tokens is not None and not _positive_int(max_tokens):
            raise DatasetError("path", f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
        limit = max_tokens if _positive_int(max_tokens) else None
        if limit is not None and SEQUENCE_TOKENS.problem(limit):
            raise DatasetError("path", f"{where}: max_tokens {SEQUENCE_TOKENS.problem(limit)}")
        if category is not None and not isinstance(category, str):
            raise DatasetError("path", f"{where}: category must be a string, got {category!r}")
        entries.append(
            DatasetEntry(
                prompt=None if messages or not isinstance(prompt, str) else prompt,
                messages=messages,
                max_tokens=limit,
                category=category,
            )
        )
    return Dataset("jsonl", entries)


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


def _conversations(path: Path) -> list[list[tuple[str, str]]]:
    """A ShareGPT file's conversations as (role, text) pairs, user and assistant alternating from the
    first user turn; a conversation that breaks the alternation ends where it breaks."""
    try:
        data = json.loads(_read(path))
    except ValueError as exc:
        raise DatasetError("path", f"{path} is not JSON ({exc})") from None
    found = []
    for item in data if isinstance(data, list) else []:
        turns = item.get("conversations") if isinstance(item, dict) else None
        pairs: list[tuple[str, str]] = []
        for turn in turns if isinstance(turns, list) else []:
            role = _SHAREGPT_ROLES.get(str(turn.get("from"))) if isinstance(turn, dict) else None
            text = turn.get("value") if isinstance(turn, dict) else None
            if not pairs and role != "user":
                continue  # a system line or an assistant greeting before the first question
            if role != ("user" if len(pairs) % 2 == 0 else "assistant") or not isinstance(text, str):
                break
            if not text.strip():
                break
            pairs.append((role, text))
        if len(pairs) >= 2:
            found.append(pairs[: len(pairs) // 2 * 2])  # each question with its reply
    if not found:
        raise DatasetError(
            "path",
            f'{path} holds no ShareGPT conversation (a list of {{"conversations": [{{"from": "human"...',
        )
    return found


def _estimated(reply: str) -> int:
    return max(1, math.ceil(len(reply) / CHARS_PER_TOKEN))


def _estimate_warning(path: Path) -> str:
    return (
        f"{path}: reply lengths are estimated at ~{CHARS_PER_TOKEN} characters per token (the server "
        "has no /tokenize), so max_tokens per request is approximate"
    )


def sharegpt_dataset(path: Path) -> Dataset:
    entries = [
        DatasetEntry(prompt=pairs[0][1], max_tokens=_estimated(pairs[1][1]), reply=pairs[1][1])
        for pairs in _conversations(path)
    ]
    return Dataset("sharegpt", entries, warning=_estimate_warning(path))


_HISTORY_HINT = (
    "each turn is sent with the whole conversation before it, so the histories grow with the square of "
    "a conversation's turns: cut long conversations with max_turns"
)


def multi_turn_dataset(table: Mapping[str, object], base: Path, chat: bool) -> Dataset:
    """Each conversation a session, each question a turn sent with the conversation so far."""
    _reject_unknown(table, "multi_turn", ("path", "max_turns", "think_time_s"))
    if not chat:
        raise DatasetError(
            "kind", 'multi_turn sends each turn with its history as messages: set endpoint = "chat"'
        )
    max_turns = _dataset_number(table, "max_turns", int(DATASET_BOUNDS["max_turns"].hi))
    think = table.get("think_time_s", 0.0)
    if isinstance(think, bool) or not isinstance(think, int | float):
        raise DatasetError("think_time_s", f"must be a number of seconds, got {think!r}")
    _within(think, "think_time_s", "", DATASET_BOUNDS["think_time_s"])
    path = _path(table, base, "multi_turn")
    entries: list[DatasetEntry] = []
    held = 0  # estimated tokens of every turn's history: turn k's body repeats the k-1 turns before it
    for session, pairs in enumerate(_conversations(path)):
        # One message object per line of the conversation, shared by every turn's history (each turn
        # holds a list of references, not copies: 3000 turns of copies took 2.9 GB).
        messages: list[JSONObject] = [{"role": role, "content": text} for role, text in pairs]
        history_tokens = 0
        for turn in range(1, min(len(pairs) // 2, max_turns) + 1):
            history = messages[: 2 * turn - 1]
            history_tokens += sum(_estimated(text) for _, text in pairs[max(0, 2 * turn - 3) : 2 * turn - 1])
            held += history_tokens
            _check_drawn(held, "max_turns", len(entries) + 1, _HISTORY_HINT)
            reply = pairs[2 * turn - 1][1]
            entries.append(
                DatasetEntry(
                    messages=history,
                    max_tokens=_estimated(reply),
                    reply=reply,
                    category=f"turn {turn}",
                    session=session,
                    turn=turn,
                )
            )
    return Dataset("multi_turn", entries, warning=_estimate_warning(path), think_time_s=float(think))


def _dataset_number(table: Mapping[str, object], key: str, default: int | None = None) -> int:
    """A whole-number [workload.dataset] key within DATASET_BOUNDS, or `default` where it is left out."""
    value = table.get(key, default)
    if value is None:
        raise DatasetError(key, "is missing")
    if not isinstance(value, int) or isinstance(value, bool):
        raise DatasetError(key, f"must be an integer, got {value!r}")
    _within(value, key, "", DATASET_BOUNDS[key])
    return value


def _reject_unknown(table: Mapping[str, object], kind: str, keys: tuple[str, ...]) -> None:
    unknown = set(table) - {"kind", *keys}
    if unknown:
        raise DatasetError(sorted(unknown)[0], f"is not a key of a {kind} dataset ({', '.join(keys)})")


def _check_drawn(
    drawn: int, key: str, count: int, hint: str = "send fewer requests or shorter prompts"
) -> None:
    """MAX_DRAWN_TOKENS over every token id a dataset holds before the run; `key` and `hint` name
    what to shorten."""
    if drawn > MAX_DRAWN_TOKENS:
        raise DatasetError(
            key,
            f"draws {drawn} prompt tokens over {count} requests, above the {MAX_DRAWN_TOKENS} a run "
            f"builds up front; {hint}",
        )


def _json_lines(path: Path) -> list[tuple[str, JSONObject]]:
    """A JSONL file's objects, each with its `file:line` for the error that names it."""
    rows = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError("path", f"{where} is not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise DatasetError("path", f"{where} is not a JSON object")
        rows.append((where, obj))
    if not rows:
        raise DatasetError("path", f"names {path}, which holds no request")
    return rows


def trace_dataset(table: Mapping[str, object], base: Path, seed: int) -> Dataset:
    """A timed trace, entries in timestamp order (a trace is a schedule: a line out of order would
    otherwise be sent late), each due at its timestamp less the first line's."""
    _reject_unknown(table, "trace", ("path", "format", "block_tokens", "vocab_size"))
    fmt = table.get("format", "mooncake")
    if fmt not in TRACE_FORMATS:
        raise DatasetError("format", f"must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
    unit_s, default_block = TRACE_FORMATS[fmt]
    block = _dataset_number(table, "block_tokens", default_block)
    vocab = _dataset_number(table, "vocab_size", DEFAULT_VOCAB_SIZE)
    import numpy as np

    blocks: dict[int, list[int]] = {}
    rows: list[tuple[float, DatasetEntry]] = []
    drawn = 0  # every token id held: the lines' prompts and the hash blocks they are cut from

    def block_ids(hash_id: int) -> list[int]:
        nonlocal drawn
        if hash_id not in blocks:
            drawn += block
            hint = f"each hash id is a block of block_tokens = {block} ids ({fmt} traces use {default_block})"
            _check_drawn(drawn, "block_tokens", len(rows) + 1, hint)
            rng = np.random.default_rng([seed, 0, hash_id])
            blocks[hash_id] = rng.integers(FIRST_TOKEN_ID, vocab, size=block).tolist()
        return blocks[hash_id]

    for index, (where, obj) in enumerate(_json_lines(_path(table, base, "trace"))):
        stamp, out = obj.get("timestamp"), _token_count(obj.get("output_length"))
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
            raise DatasetError("path", f"{where} needs a numeric `timestamp`, got {stamp!r}")
        if out is None:
            raise DatasetError(
                "path", f"{where}: output_length must be an integer in [1, {SEQUENCE_TOKENS.hi}]"
            )
        text = obj.get("text", obj.get("prompt"))
        prompt: str | list[int]
        if isinstance(text, str) and text:
            prompt = text
        else:
            length, hashes = _token_count(obj.get("input_length")), obj.get("hash_ids", [])
            if length is None:
                raise DatasetError(
                    "path", f"{where} needs an `input_length` in [1, {SEQUENCE_TOKENS.hi}] or a `text`"
                )
            listed = hashes if isinstance(hashes, list) else []
            hash_ids = [int(h) for h in listed if isinstance(h, int) and (h == 0 or _positive_int(h))]
            if not isinstance(hashes, list) or len(hash_ids) != len(hashes):
                raise DatasetError("path", f"{where}: hash_ids must be a list of non-negative integers")
            drawn += length
            _check_drawn(drawn, "path", index + 1)
            ids = [t for h in hash_ids[: math.ceil(length / block)] for t in block_ids(h)][:length]
            if len(ids) < length:  # past its blocks the prompt is this line's own
                rng = np.random.default_rng([seed, 1, index])
                ids += rng.integers(FIRST_TOKEN_ID, vocab, size=length - len(ids)).tolist()
            prompt = ids
        rows.append((float(stamp) * unit_s, DatasetEntry(prompt=prompt, max_tokens=out, ignore_eos=True)))
    rows.sort(key=lambda row: row[0])
    first = rows[0][0]
    entries = [replace(entry, timestamp_s=stamp - first) for stamp, entry in rows]
    return Dataset("trace", entries, seed=seed, vocab_size=vocab)


def prefix_repetition_dataset(table: Mapping[str, object], count: int, seed: int) -> Dataset:
    """vLLM's prefix_repetition: `count // num_prefixes` requests per prefix, each prefix followed by
    a suffix of its own, shuffled from the seed (as vLLM shuffles) so a prefix's requests are spread
    over the run rather than sent back to back."""
    keys = ("prefix_len", "suffix_len", "num_prefixes", "output_len", "vocab_size")
    _reject_unknown(table, "prefix_repetition", keys)
    prefix_len, suffix_len = _dataset_number(table, "prefix_len"), _dataset_number(table, "suffix_len")
    num_prefixes, output_len = _dataset_number(table, "num_prefixes"), _dataset_number(table, "output_len")
    vocab = _dataset_number(table, "vocab_size", DEFAULT_VOCAB_SIZE)
    per_prefix = count // num_prefixes
    if per_prefix == 0:
        raise DatasetError(
            "num_prefixes",
            f"({num_prefixes}) is more than num_requests ({count}): every prefix needs a request",
        )
    _check_drawn(per_prefix * num_prefixes * (prefix_len + suffix_len), "prefix_len", count)
    import numpy as np

    rng = np.random.default_rng(seed)
    entries = []
    for _ in range(num_prefixes):
        prefix = rng.integers(FIRST_TOKEN_ID, vocab, size=prefix_len).tolist()
        for _ in range(per_prefix):
            suffix = rng.integers(FIRST_TOKEN_ID, vocab, size=suffix_len).tolist()
            entries.append(DatasetEntry(prompt=prefix + suffix, max_tokens=output_len, ignore_eos=True))
    order = rng.permutation(len(entries))
    return Dataset("prefix_repetition", [entries[i] for i in order], seed=seed, vocab_size=vocab)


def _categories(table: Mapping[str, object]) -> set[str] | None:
    wanted = table.get("category")
    if wanted is None:
        return None
    names = [wanted] if isinstance(wanted, str) else wanted
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise DatasetError(
            "category", f'must be a name or a list of names, e.g. ["coding", "math"]; got {wanted!r}'
        )
    return set(names)


def _question_dataset(
    kind: str, table: Mapping[str, object], path: Path, prompt_of: Callable[[JSONObject], JSONValue]
) -> Dataset:
    """SpecBench and SPEED-Bench: one JSON object per line with a `category`, the prompt found by
    `prompt_of` (None where the line has none), only the categories asked for."""
    wanted = _categories(table)
    output_len = _dataset_number(table, "output_len") if "output_len" in table else None
    entries, seen = [], set()
    for where, obj in _json_lines(path):
        category, prompt = obj.get("category"), prompt_of(obj)
        if not isinstance(category, str):
            raise DatasetError("path", f"{where} needs a `category` string")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError("path", f"{where} holds no prompt (the {kind} layout: see docs/scenarios.md)")
        seen.add(category)
        if wanted is None or category in wanted:
            entries.append(DatasetEntry(prompt=prompt, max_tokens=output_len, category=category))
    if wanted is not None and wanted - seen:
        missing = ", ".join(sorted(wanted - seen))
        raise DatasetError("category", f"names {missing}, not in {path} (it has {', '.join(sorted(seen))})")
    return Dataset(kind, entries)


def _first_turn(obj: JSONObject) -> JSONValue:
    turns = obj.get("turns")
    return turns[0] if isinstance(turns, list) and turns else None


def _first_message(obj: JSONObject) -> JSONValue:
    messages = obj.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return first.get("content") if isinstance(first, dict) else None


def spec_bench_dataset(table: Mapping[str, object], base: Path) -> Dataset:
    _reject_unknown(table, "spec_bench", ("path", "category", "output_len"))
    return _question_dataset("spec_bench", table, _path(table, base, "spec_bench"), _first_turn)


def speed_bench_dataset(table: Mapping[str, object], base: Path) -> Dataset:
    """`path` is the folder (vLLM's `--dataset-path` for speed_bench); `subset` picks its file."""
    _reject_unknown(table, "speed_bench", ("path", "subset", "category", "output_len"))
    subset = table.get("subset", "qualitative")
    if subset not in SPEED_BENCH_SUBSETS:
        raise DatasetError("subset", f"must be one of {', '.join(SPEED_BENCH_SUBSETS)}, got {subset!r}")
    folder = _path(table, base, "speed_bench")
    if not folder.is_dir():
        raise DatasetError("path", f"names {folder}, which is not a folder; name the SPEED-Bench folder")
    return _question_dataset("speed_bench", table, folder / f"{subset}.jsonl", _first_message)


def _path(table: Mapping[str, object], base: Path, kind: str) -> Path:
    name = table.get("path")
    if not isinstance(name, str):
        raise DatasetError("path", f"is missing; a {kind} dataset reads its requests from a file")
    return (base / name).resolve()


def load_dataset(table: Mapping[str, object], base: Path, count: int, seed: int, chat: bool) -> Dataset:
    """Read [workload.dataset]; `count` is how many requests a random dataset draws."""
    kind = table.get("kind")
    if kind not in DATASET_KINDS:
        raise DatasetError("kind", f"must be one of {', '.join(DATASET_KINDS)}, got {kind!r}")
    if kind == "random":
        return random_dataset(table, count, seed)
    if kind == "prefix_repetition":
        return prefix_repetition_dataset(table, count, seed)
    if kind == "trace":
        return trace_dataset(table, base, seed)
    if kind == "multi_turn":
        return multi_turn_dataset(table, base, chat)
    if kind == "spec_bench":
        return spec_bench_dataset(table, base)
    if kind == "speed_bench":
        return speed_bench_dataset(table, base)
    _reject_unknown(table, kind, ("path",))
    path = _path(table, base, kind)
    return jsonl_dataset(path, chat) if kind == "jsonl" else sharegpt_dataset(path)
