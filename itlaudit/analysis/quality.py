"""Output-quality figures for one generated text: pure functions, no I/O.

A latency win means nothing if the faster server writes gibberish. The failure these figures are
built for (a CUDA-graph replay reading stale decode metadata, seed 003) kept the output fluent for
hundreds of tokens and then drifted into numbers and dates: clean runs had digit_ratio 0.0036–0.0195
and no digit/punctuation runs, bad runs 0.1286–0.5925 with 1–6 such runs. The thresholds below sit
between those two populations; they are parameters, not constants of nature.

Judge quality with natural EOS (ignore_eos false): forcing a model past the point where it wants to
stop produces degenerate text on a healthy server too, which would blur exactly this signal.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "DEFAULT_THRESHOLDS",
    "REPEATED_NUM_MIN_REPEATS",
    "REP_NS",
    "WEIRD_RUN_MIN_CHARS",
    "WEIRD_RUN_MIN_DIGITS",
    "GibberishThresholds",
    "TextQuality",
    "compression_ratio",
    "gibberish_reasons",
    "rep_n",
    "text_quality",
    "text_sha256",
    "weird_runs",
]

REP_NS = (2, 3, 4)
# A "weird run" is a stretch of only digits, punctuation, symbols and spaces that is long and
# digit-heavy: "2026-06-15 12:30:45 2026-06-16" qualifies, a markdown rule "|---|---|" does not.
WEIRD_RUN_MIN_CHARS = 10
WEIRD_RUN_MIN_DIGITS = 6
# The same number three times in a row ("2024 2024 2024") is a decoding loop, not prose.
REPEATED_NUM_MIN_REPEATS = 3

# CJK characters are one token each (no spaces to split on); other scripts split into words and
# single punctuation marks, which is enough for the n-gram repetition figures.
_TOKEN_RE = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W\u3400-\u9fff\uf900-\ufaff]+|[^\w\s]")
_NUMBER_RUN_RE = re.compile(rf"(\d{{2,}})(?:\W+\1(?!\d)){{{REPEATED_NUM_MIN_REPEATS - 1},}}")
_DIGIT_RUN_RE = re.compile(r"\d+")


def text_sha256(text: str) -> str:
    """Identity of an output: equal hashes across runs prove the same text without storing it twice."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _is_run_char(ch: str) -> bool:
    return ch.isdigit() or ch.isspace() or unicodedata.category(ch)[0] in "PS"


def weird_runs(text: str) -> int:
    """Maximal digit/punctuation stretches at least WEIRD_RUN_MIN_CHARS long (ignoring edge spaces)
    with at least WEIRD_RUN_MIN_DIGITS digits."""
    count = 0
    run: list[str] = []
    for ch in [*text, "a"]:  # the sentinel letter closes a trailing run
        if _is_run_char(ch):
            run.append(ch)
            continue
        stretch = "".join(run).strip()
        if len(stretch) >= WEIRD_RUN_MIN_CHARS and sum(c.isdigit() for c in stretch) >= WEIRD_RUN_MIN_DIGITS:
            count += 1
        run = []
    return count


def rep_n(tokens: list[str], n: int) -> float:
    """1 - distinct n-grams / n-grams: 0 for text that never repeats itself, near 1 for a loop."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw, 9)) if raw else 0.0


def text_quality(text: str) -> TextQuality:
    chars = sum(1 for ch in text if not ch.isspace())
    digits = sum(1 for ch in text if ch.isdigit())
    tokens = _TOKEN_RE.findall(text)
    reps = {n: rep_n(tokens, n) for n in REP_NS}
    return TextQuality(
        chars=chars,
        digit_ratio=digits / chars if chars else 0.0,
        weird_runs=weird_runs(text),
        repeated_num_runs=len(_NUMBER_RUN_RE.findall(text)),
        max_digit_run=max((len(m) for m in _DIGIT_RUN_RE.findall(text)), default=0),
        rep_2=reps[2],
        rep_3=reps[3],
        rep_4=reps[4],
        compression_ratio=compression_ratio(text),
        text_sha256=text_sha256(text),
    )


@dataclass(frozen=True)
class GibberishThresholds:
    """When an output is suspected gibberish. Defaults from seed 003: every clean run had
    digit_ratio ≤ 0.0195 and 0 weird runs, every bad one ≥ 0.1286; 0.05 leaves a margin on both sides.
    Outputs shorter than `min_chars` are not judged: a 16-token answer that is a date is fine."""

    max_digit_ratio: float = 0.05
    max_weird_runs: int = 2
    max_repeated_num_runs: int = 0
    min_chars: int = 200


DEFAULT_THRESHOLDS = GibberishThresholds()


def gibberish_reasons(
    quality: TextQuality, thresholds: GibberishThresholds = DEFAULT_THRESHOLDS
) -> list[str]:
    """Which thresholds the text exceeds, in words; empty when it looks clean or is too short to judge."""
    if quality.chars < thresholds.min_chars:
        return []
    checks = [
        ("digit_ratio", quality.digit_ratio, thresholds.max_digit_ratio),
        ("weird_runs", quality.weird_runs, thresholds.max_weird_runs),
        ("repeated_num_runs", quality.repeated_num_runs, thresholds.max_repeated_num_runs),
    ]
    return [f"{name} {value:.4g} > {limit:g}" for name, value, limit in checks if value > limit]
