"""Output-quality figures for one generated text: pure functions, no I/O.

A latency win means nothing if the faster server writes gibberish. The failure these figures are
built for (a CUDA-graph replay reading stale decode metadata, seed 003) kept the output fluent for
hundreds of tokens and then drifted into numbers and dates: clean runs had digit_ratio 0.0036–0.0195
and no digit/punctuation runs, bad runs 0.1286–0.5925 with 1–6 such runs. The thresholds below sit
between those two populations and keep clear of a third, real text that is digit-heavy on purpose
(lists, tables, sequences; GibberishThresholds says how); they are parameters, not constants of nature.

Judge quality with natural EOS (ignore_eos false): forcing a model past the point where it wants to
stop produces degenerate text on a healthy server too, which would blur exactly this signal.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import re
import unicodedata
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from itlaudit.model.jsonvalue import JSONObject

if TYPE_CHECKING:  # numpy is imported where a figure is computed: the CLI shows these defaults
    import numpy as np

REP_NS = (2, 3, 4)
# A "weird run" is a stretch of only digits, punctuation, symbols and spaces within one line that is
# long and digit-heavy: "2026-06-15 12:30:45 2026-06-16" qualifies, a markdown rule "|---|---|" does
# not, nor does a line break between numbers: "(1963)\n1969:" is a timeline's layout (two lines of a
# list or table, which a real model writes on request), where the seed's drift ran on inline.
WEIRD_RUN_MIN_CHARS = 10
WEIRD_RUN_MIN_DIGITS = 6
# The same number three times in a row ("2024 2024 2024") is a decoding loop, not prose.
REPEATED_NUM_MIN_REPEATS = 3

# A reply can be 50 MB (a long-output audit, fault row N20). Every figure is a compiled regex, str or
# numpy pass, linear in the text's length, and every list a pass builds covers at most _SLICE
# characters, so the memory a text's figures take stays a fraction of the text's own: no per-character
# Python loop, no list of every token (benchmarks/derive_long_output.py prints the figures).
_SLICE = 1 << 20
_TOKEN_SLICE = 1 << 18  # ~50000 tokens: their str objects are the largest list a pass builds
# CJK characters are one token each (no spaces to split on); other scripts split into words and
# single punctuation marks, which is enough for the n-gram repetition figures.
_CJK = "\u3400-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
_TOKEN_CUT_RE = re.compile(rf"[\W{_CJK}]")  # a slice may end before one of these without cutting a token
# A number is a whole digit run: starting only at a run's first digit keeps the search linear on a
# long run of digits, where a start at every digit of it would make it quadratic. (The lookbehind
# follows the first digit so that the search still skips ahead to digits.)
_NUMBER_RUN_RE = re.compile(rf"(\d(?<!\d\d)\d+)(?:\W+\1(?!\d)){{{REPEATED_NUM_MIN_REPEATS - 1},}}")
_DIGIT_RUN_RE = re.compile(r"\d+")
_NGRAM_MIX = 0x9E3779B97F4A7C15  # odd, 64-bit: n-gram keys mix token ids like a multiplicative hash
_NGRAM_BLOCK = 1 << 20
_NGRAM_BUCKET = 1 << 21  # keys sorted at once: 16 MB
# Code points past the BMP: a class holding any of them is matched range by range, not by table, so
# the run patterns hold them only for a text that has some (an emoji is a symbol, so a run character).
_ASTRAL_RE = re.compile("[\U00010000-\U0010ffff]")
# zlib level 9 runs at ~5 MB/s on prose: a longer text's compression ratio is its first this many
# characters' (a loop that long shows in rep_n over the whole text too).
_COMPRESSION_CHARS = 4 * _SLICE


def _char_class(test: Any, astral: bool) -> str:
    """A regex character class of every code point `test` accepts, made of ranges: the BMP's in one
    bracket (matched by table), plane 1's in a second one only when `astral`. Planes 0 and 1 hold every
    digit, space, punctuation mark and symbol Unicode defines (tests/test_quality.py checks this against
    all of Unicode)."""
    bmp = _code_ranges(test, 0, 0x10000)
    return f"(?:[{bmp}]|[{_code_ranges(test, 0x10000, 0x20000)}])" if astral else f"[{bmp}]"


def _code_ranges(test: Any, first: int, end: int) -> str:
    ranges: list[tuple[int, int]] = []
    for code in range(first, end):
        if test(chr(code)):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


@functools.cache
def _spaces() -> tuple[str, ...]:
    """Every character str.isspace() accepts (all in the BMP): counted with str.count, a memchr-speed
    pass each, where a regex would build a match per run of spaces."""
    return tuple(chr(code) for code in range(0x10000) if chr(code).isspace())


# What str.splitlines splits on: a weird run never crosses one.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _is_run_char(ch: str) -> bool:
    return ch.isdigit() or (ch.isspace() and ch not in _LINE_BREAKS) or unicodedata.category(ch)[0] in "PS"


def _run_patterns(text: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(a weird run, stripped of its edge spaces and at least WEIRD_RUN_MIN_CHARS long; a run of digits
    in str.isdigit's sense, superscripts included, as the rule has always counted them), for `text`."""
    return _patterns(_ASTRAL_RE.search(text) is not None)


@functools.cache
def _patterns(astral: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    edge = _char_class(lambda ch: _is_run_char(ch) and not ch.isspace(), astral)
    inner = _char_class(_is_run_char, astral)
    # Greedy to the run's end, then back to its last non-space: the whole stripped stretch, never part.
    run = re.compile(f"{edge}{inner}{{{WEIRD_RUN_MIN_CHARS - 2},}}{edge}")
    return run, re.compile(f"{_char_class(str.isdigit, astral)}+")


def text_sha256(text: str) -> str:
    """Identity of an output: equal hashes across runs prove the same text without storing it twice."""
    digest = hashlib.sha256()
    for piece in _utf8_slices(text):
        digest.update(piece)
    return digest.hexdigest()


def _utf8_slices(text: str, limit: int | None = None) -> Iterator[bytes]:
    for start in range(0, len(text) if limit is None else min(len(text), limit), _SLICE):
        yield text[start : start + _SLICE].encode("utf-8")


def _matched_chars(pattern: re.Pattern[str], text: str) -> int:
    """How many characters `pattern`'s matches cover, a slice at a time (a run cut by a slice's end is
    counted in two parts, which adds up the same)."""
    return sum(
        sum(map(len, pattern.findall(text, start, start + _SLICE))) for start in range(0, len(text), _SLICE)
    )


@dataclass(frozen=True)
class TextQuality:
    """The figures seed 003 used to tell a broken decode path from a healthy one."""

    chars: int  # non-whitespace characters: the denominator of digit_ratio
    digit_ratio: float
    weird_runs: int
    repeated_num_runs: int
    max_digit_run: int
    rep_2: float  # share of repeated 2-grams among all 2-grams (0 = no repetition)
    rep_3: float
    rep_4: float
    compression_ratio: float  # UTF-8 bytes / zlib bytes: loops compress far better than prose
    text_sha256: str

    def to_json(self) -> JSONObject:
        return asdict(self)


def weird_runs(text: str) -> int:
    """Maximal digit/punctuation stretches at least WEIRD_RUN_MIN_CHARS long (ignoring edge spaces)
    with at least WEIRD_RUN_MIN_DIGITS digits."""
    run, digits = _run_patterns(text)
    count = 0
    for match in run.finditer(text):
        seen = 0
        for found in digits.finditer(text, match.start(), match.end()):
            seen += found.end() - found.start()
            if seen >= WEIRD_RUN_MIN_DIGITS:
                count += 1
                break
    return count


def _token_ids(text: str) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The text's tokens as ids (equal tokens, equal ids), 4 bytes a token: tokenised a slice at a
    time, each slice ending where no token is cut."""
    import numpy as np

    ids: array[int] = array("I")
    vocabulary: dict[str, int] = {}
    first_seen = itertools.count()  # a new token's id: unique, since the count never goes back
    start, size = 0, len(text)
    while start < size:
        cut = _TOKEN_CUT_RE.search(text, min(start + _TOKEN_SLICE, size))
        end = cut.start() if cut is not None and start + _TOKEN_SLICE < size else size
        tokens = _TOKEN_RE.findall(text, start, end)
        ids.extend(map(vocabulary.setdefault, tokens, first_seen))
        start = end
    return np.frombuffer(ids, dtype=np.uint32) if ids else np.zeros(0, dtype=np.uint32)


def rep_n(tokens: Sequence[str] | np.ndarray[Any, Any], n: int) -> float:
    """1 - distinct n-grams / n-grams: 0 for text that never repeats itself, near 1 for a loop. Tokens
    are strings or text_quality's token ids; an n-gram is a 64-bit key mixed from its ids, counted
    distinct by sorting (two n-grams sharing a key by chance: about 1 in 10^5 for 10^7 of them). Many
    n-grams are counted a share of the key space at a time (keys split by their top bits, which are
    distinct apart), so no more than _NGRAM_BUCKET keys are held at once."""
    import numpy as np

    ids = tokens if isinstance(tokens, np.ndarray) else _token_ids_of(tokens)
    grams = len(ids) - n + 1
    if grams <= 0:
        return 0.0
    bits = max(0, math.ceil(math.log2(grams / _NGRAM_BUCKET)))
    shift = np.uint64(64 - bits)
    distinct = 0
    for bucket in range(1 << bits):
        blocks = _ngram_keys(ids, n, grams)
        keys = (
            np.concatenate([block[(block >> shift) == bucket] for block in blocks]) if bits else next(blocks)
        )
        keys.sort()
        distinct += int(np.count_nonzero(keys[1:] != keys[:-1])) + (1 if len(keys) else 0)
    return 1.0 - distinct / grams


def _ngram_keys(ids: np.ndarray[Any, Any], n: int, grams: int) -> Iterator[np.ndarray[Any, Any]]:
    """The n-grams' 64-bit keys in blocks of _NGRAM_BLOCK (all of them in one block when they fit a
    bucket)."""
    import numpy as np

    mix = np.uint64(_NGRAM_MIX)
    step = _NGRAM_BLOCK if grams > _NGRAM_BUCKET else grams
    for start in range(0, grams, step):
        end = min(start + step, grams)
        block = ids[start:end].astype(np.uint64)
        for offset in range(1, n):
            block *= mix
            block ^= ids[start + offset : end + offset]
        yield block


def _token_ids_of(tokens: Sequence[str]) -> np.ndarray[Any, np.dtype[np.uint32]]:
    import numpy as np

    vocabulary: dict[str, int] = {}
    return np.fromiter(
        map(vocabulary.setdefault, tokens, itertools.count()), dtype=np.uint32, count=len(tokens)
    )


def compression_ratio(text: str) -> float:
    """zlib level 9 over the UTF-8 text (its first _COMPRESSION_CHARS characters), fed a slice at a
    time: the same stream as one call, without a second copy of the text."""
    compressor = zlib.compressobj(9)
    raw = packed = 0
    for piece in _utf8_slices(text, _COMPRESSION_CHARS):
        raw += len(piece)
        packed += len(compressor.compress(piece))
    packed += len(compressor.flush())
    return raw / packed if raw else 0.0


@functools.lru_cache(maxsize=8)
def text_quality(text: str) -> TextQuality:
    """Cached for the last few texts: derivation, the gibberish rule and the ledger each ask for the
    same record's figures, and on a 50 MB reply each pass takes seconds."""
    chars = len(text) - sum(map(text.count, _spaces()))
    digits = _matched_chars(_run_patterns(text)[1], text)
    ids = _token_ids(text)
    reps = {n: rep_n(ids, n) for n in REP_NS}
    return TextQuality(
        chars=chars,
        digit_ratio=digits / chars if chars else 0.0,
        weird_runs=weird_runs(text),
        repeated_num_runs=sum(1 for _ in _NUMBER_RUN_RE.finditer(text)),
        max_digit_run=max((m.end() - m.start() for m in _DIGIT_RUN_RE.finditer(text)), default=0),
        rep_2=reps[2],
        rep_3=reps[3],
        rep_4=reps[4],
        compression_ratio=compression_ratio(text),
        text_sha256=text_sha256(text),
    )


@dataclass(frozen=True)
class GibberishThresholds:
    """When an output is suspected gibberish: digit_ratio above max_digit_ratio, or above
    weird_runs_min_digit_ratio with more than max_weird_runs weird runs, or more repeated-number runs
    than max_repeated_num_runs. Outputs shorter than `min_chars` are not judged: a 16-token answer that
    is a date is fine.

    Calibrated on two populations. Seed 003: clean runs had digit_ratio ≤ 0.0195 and 0 weird runs; the
    broken ones (digit_ratio, weird runs) (0.1286, 6), (0.1296, 5), (0.2227, 3), (0.3962, 2), (0.5254, 1)
    and 0.5925. Real text (tests/fixtures/gemma_outputs.jsonl: 210 Gemma 3 270M outputs of prose, code,
    lists, numbers and dialogue, benchmarks/gibberish_fp.py): numbered lists, population tables, prime
    sequences and timelines reach digit_ratio 0.27 (0.345 for one SQL reply ending in a 78-digit number)
    with at most 2 weird runs above digit_ratio 0.12, save one quarterly report (0.139, 4). A digit
    ratio alone cannot separate them below ~0.35, so below it the digits must come with weird runs:
    digit-heavy text is gibberish when it is also full of long digit-and-punctuation stretches, as
    the seed's broken runs were. False-positive rate on the real text: 1 of 210 (0.5 %); the old
    single 0.05 digit-ratio threshold flagged 39 of 210 (18.6 %)."""

    max_digit_ratio: float = 0.35
    max_weird_runs: int = 2
    max_repeated_num_runs: int = 0
    min_chars: int = 200
    weird_runs_min_digit_ratio: float = 0.12


DEFAULT_THRESHOLDS = GibberishThresholds()


def gibberish_reasons(
    quality: TextQuality, thresholds: GibberishThresholds = DEFAULT_THRESHOLDS
) -> list[str]:
    """Which thresholds the text exceeds, in words; empty when it looks clean or is too short to judge."""
    if quality.chars < thresholds.min_chars:
        return []
    checks = [
        ("digit_ratio", quality.digit_ratio, thresholds.max_digit_ratio),
        ("repeated_num_runs", quality.repeated_num_runs, thresholds.max_repeated_num_runs),
    ]
    reasons = [f"{name} {value:.4g} > {limit:g}" for name, value, limit in checks if value > limit]
    numeric = quality.digit_ratio > thresholds.weird_runs_min_digit_ratio
    if numeric and quality.weird_runs > thresholds.max_weird_runs:
        reasons.insert(
            1,
            f"weird_runs {quality.weird_runs} > {thresholds.max_weird_runs} "
            f"at digit_ratio {quality.digit_ratio:.4g} > {thresholds.weird_runs_min_digit_ratio:g}",
        )
    return reasons
