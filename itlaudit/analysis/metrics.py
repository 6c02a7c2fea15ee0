"""Per-request latency metrics computed from raw records: pure functions, no I/O.

The point of this module is that inter-token latency is divided by *tokens*, not by SSE chunks. With
speculative decoding / MTP one chunk carries several accepted tokens, so a chunk-counting benchmark
reports an ITL inflated by about the acceptance length. The server's cumulative
`usage.completion_tokens` (continuous usage stats) is the ground truth for how many tokens each chunk
carried; returned token ids are the next best thing; counting chunks is kept only as a last resort and
is labelled as such (`token_source == "chunks"`) so findings can say the figure is not comparable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from itlaudit.model.block import percentile_key
from itlaudit.model.records import ChunkSeries, RequestRecord, Status

TOKEN_SOURCE_USAGE = "usage"
TOKEN_SOURCE_TOKEN_IDS = "token_ids"
# A local tokenizer over the streamed text (--tokenizer): the tokens each chunk completed, re-counted.
# Exact where the model's output re-tokenizes to itself (a trained model's text mostly does); a guess
# where it does not, so the final count is shown beside the server's usage total.
TOKEN_SOURCE_TOKENIZER = "tokenizer"
TOKEN_SOURCE_CHUNKS = "chunks"

SUMMARY_METRICS = (
    "itl_ms",
    "chunk_itl_ms",
    "itl_inflation",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "tokens_per_chunk",
    "decode_tokens_per_chunk",
    "decode_tokens_per_s",
    "completion_tokens",
)


def content_chunk_mask(chunks: ChunkSeries) -> tuple[np.ndarray, np.ndarray, str]:
    """Boolean mask of content chunks, cumulative tokens at each of them, and where the counts came from.

    Usage is trusted only when every chunk that visibly carries output (text or ids) also carries a
    count: a stream with usage on some chunks only (e.g. include_usage without continuous stats, where
    just the final usage-only chunk has it) cannot attribute tokens to chunks. A content chunk under
    usage is one whose count rose above the highest count seen so far, which excludes the chat role
    chunk (count 0), finish-only and usage-only chunks, yet keeps empty-text chunks that carried a token
    (a partial UTF-8 sequence detokenises to ""), and never yields a zero or negative token step even if
    the server's counts go backwards (that is reported by findings, not absorbed here).
    """
    found = _content(chunks)
    return found.mask, found.cumulative, found.source


class _Content(NamedTuple):
    """A series' content chunks: content_chunk_mask's three, and the content chunks' stamps."""

    mask: np.ndarray
    cumulative: np.ndarray
    source: str
    t_ms: np.ndarray


# Within settled_records(): each series' content chunks as found, by id (the series and the tokenized
# counts it was found with are kept beside it, so a reused id or counts filled in since is a miss).
_SETTLED: ContextVar[dict[int, tuple[ChunkSeries, list[int] | None, _Content]] | None] = ContextVar(
    "settled_records", default=None
)


@contextmanager
def settled_records() -> Iterator[None]:
    """Within this block the records are not changed, so each one's content chunks (the mask every
    figure divides by) are found once and reused: a derivation and its report ask for them about ten
    times a record (metrics, findings, the summary's blocks, the CSVs, the plots), 0.1-0.2 ms each on a
    500-chunk stream. The arrays handed out inside are read-only. Outside it each call finds them
    afresh: the capture and the tests change series in place."""
    token = _SETTLED.set({})
    try:
        yield
    finally:
        _SETTLED.reset(token)


def _content(chunks: ChunkSeries) -> _Content:
    cache = _SETTLED.get()
    if cache is None:
        return _find_content(chunks)
    hit = cache.get(id(chunks))
    if hit is not None and hit[0] is chunks and hit[1] is chunks.tokenized:
        return hit[2]
    found = _find_content(chunks)
    for array in (found.mask, found.cumulative, found.t_ms):
        array.flags.writeable = False
    cache[id(chunks)] = (chunks, chunks.tokenized, found)
    return found


def _find_content(chunks: ChunkSeries) -> _Content:
    mask, cumulative, source = _content_mask(chunks)
    return _Content(mask, cumulative, source, np.asarray(chunks.t_ms, dtype=float)[mask])


def _content_mask(chunks: ChunkSeries) -> tuple[np.ndarray, np.ndarray, str]:
    has_choice = np.asarray(chunks.has_choice, dtype=bool)
    # the answer's characters and the reasoning channel's: a thinking chunk is a token as much as an
    # answer chunk (vLLM counts TTFT from the first token of either)
    text_len = np.asarray(chunks.text_len, dtype=np.int64) + _reasoning_len(chunks)
    ids = chunks.token_ids
    if ids.count(None) == len(ids):  # most streams: no ids at all, and no list to walk
        n_ids = np.full(len(ids), -1, dtype=np.int64)
    else:
        n_ids = np.array([-1 if one is None else len(one) for one in ids], dtype=np.int64)
    counts = np.array([np.nan if c is None else c for c in chunks.completion_tokens], dtype=float)
    has_usage = ~np.isnan(counts)
    visibly_carries = has_choice & ((text_len > 0) | (n_ids > 0))

    if (has_choice & has_usage).any() and has_usage[visibly_carries].all():
        # fmax skips NaN, and the leading 0 is the count before any chunk arrived.
        highest_before = np.fmax.accumulate(np.concatenate(([0.0], counts)))[:-1]
        mask = has_choice & (counts > highest_before)
        return mask, counts[mask].astype(np.int64), TOKEN_SOURCE_USAGE
    if (has_choice & (n_ids >= 0)).any():
        mask = has_choice & (n_ids > 0)
        return mask, np.cumsum(n_ids[mask]), TOKEN_SOURCE_TOKEN_IDS
    if chunks.tokenized is not None:
        tokenized = np.asarray(chunks.tokenized, dtype=np.int64)
        # as under usage: a chunk that completed a token; one that only began one (a split word) waits
        highest_before = np.maximum.accumulate(np.concatenate(([0], tokenized)))[:-1]
        mask = has_choice & (tokenized > highest_before)
        return mask, tokenized[mask], TOKEN_SOURCE_TOKENIZER
    mask = has_choice & (text_len > 0)
    return mask, np.arange(1, int(mask.sum()) + 1, dtype=np.int64), TOKEN_SOURCE_CHUNKS


def _reasoning_len(chunks: ChunkSeries) -> np.ndarray:
    """Each chunk's reasoning characters; zeros for a series built without them (an older record)."""
    if len(chunks.reasoning_len) != len(chunks.t_ms):
        return np.zeros(len(chunks.t_ms), dtype=np.int64)
    return np.asarray(chunks.reasoning_len, dtype=np.int64)


def answer_ms(record: RequestRecord) -> float | None:
    """When the first answer character came (TTFA): after the thinking, where a reasoning channel
    carried any; the first content chunk's time otherwise (TTFT). None where no answer came."""
    chunks = record.chunks
    for t_ms, length in zip(chunks.t_ms, chunks.text_len, strict=False):
        if length:
            return float(t_ms)
    return None


def tokens_at_chunk_ends(
    text_lens: Sequence[int], token_ends: Sequence[int], total: int | None = None
) -> list[int]:
    """For each chunk, how many tokens end at or before the chunk's last character: `text_lens` the
    chunks' lengths in characters, `token_ends` each token's end offset in the whole text (a local
    tokenizer's). With the server's `total` (its final usage), the counts are scaled to it: the
    re-encoded text spreads the tokens over the chunks, the server says how many there were (a
    model's output need not re-encode to the tokens it generated: the tiny random model's 64 tokens
    re-encode to 87-106)."""
    chunk_ends = np.cumsum(np.asarray(text_lens, dtype=np.int64))
    ends = np.sort(np.asarray(token_ends, dtype=np.int64))
    counts = np.searchsorted(ends, chunk_ends, side="right")
    if total is not None and ends.size:
        counts = np.rint(counts * (total / ends.size)).astype(np.int64)
    return [int(c) for c in counts]


def token_counts(record: RequestRecord) -> tuple[np.ndarray, np.ndarray, str]:
    """(t_ms of content chunks, cumulative tokens at each, source): the series every metric divides by."""
    found = _content(record.chunks)
    return found.t_ms, found.cumulative, found.source


def per_chunk_itl_ms(record: RequestRecord) -> np.ndarray:
    """Each decode gap spread over the tokens it delivered, so MTP bursts do not look like stalls."""
    t, cumulative, _ = token_counts(record)
    return np.diff(t) / np.diff(cumulative)


def decode_gaps(record: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(gap before each decode chunk in ms, tokens that chunk delivered): the raw material of the pooled
    ITL percentiles. vllm bench pools the gaps as they are (its ITL, one value per chunk); the token
    ITL pools each gap divided by its tokens, weighted by them (a 4-token chunk after 12 ms is four
    3 ms gaps), so a burst of accepted drafts counts as the tokens it carried."""
    t, cumulative, _ = token_counts(record)
    return np.diff(t), np.diff(cumulative)


def channel_gaps(record: RequestRecord) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A thinking model's decode gaps per channel, "reasoning" and "answer": each gap between two
    content chunks of the same channel with the tokens the later one delivered (decode_gaps' pairs).
    The gap across the channel change (the `</think>` step, a chunk of markup only) belongs to
    neither, so each channel's ITL is its own decode speed. Empty for a stream that never thought."""
    if not record.reasoning:
        return {}
    mask, cumulative, _, t = _content(record.chunks)
    text = np.asarray(record.chunks.text_len, dtype=np.int64)[mask]
    thought = _reasoning_len(record.chunks)[mask]
    # 1: reasoning only, 2: answer, 0: neither (markup, or a chunk that carried both channels)
    channel = np.where((thought > 0) & (text == 0), 1, np.where((text > 0) & (thought == 0), 2, 0))
    same = (channel[1:] == channel[:-1]) & (channel[1:] > 0)
    gaps, tokens = np.diff(t), np.diff(cumulative)
    return {
        name: (gaps[same & (channel[1:] == code)], tokens[same & (channel[1:] == code)])
        for name, code in (("reasoning", 1), ("answer", 2))
    }


def _channel_itl(gaps: np.ndarray, tokens: np.ndarray) -> float | None:
    """A channel's token ITL over its own gaps (None where it had none, or a clock saw none pass)."""
    span = float(gaps.sum())
    return ratio(span, float(tokens.sum())) if span > 0 else None


def tokens_per_chunk_hist(record: RequestRecord) -> dict[int, int]:
    """Tokens per content chunk → number of chunks: the acceptance-length distribution seen on the wire."""
    _, cumulative, _ = token_counts(record)
    steps = np.diff(cumulative, prepend=0)
    return {int(k): v for k, v in sorted(Counter(steps.tolist()).items())}


@dataclass(frozen=True)
class RequestMetrics:
    """Derived figures for one request; None wherever the stream cannot define them.

    `itl_ms` is the token-true ITL; `chunk_itl_ms` is what chunk-counting tools report, kept so the
    report can show the inflation rather than just assert it.
    """

    ttft_ms: float | None
    itl_ms: float | None
    chunk_itl_ms: float | None
    itl_inflation: float | None
    tokens_per_chunk: float | None
    decode_tokens_per_chunk: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    decode_tokens_per_s: float | None
    completion_tokens: int | None
    content_chunks: int
    token_source: str
    # A thinking model's answer (chat with a reasoning parser): when its first character came (TTFA;
    # TTFT stays the first token of either channel, as vLLM counts it), and how many of the completion
    # tokens were reasoning (the server's usage details). None for a stream without a reasoning channel.
    ttfa_ms: float | None = None
    reasoning_tokens: int | None = None
    # The answer's tokens (completion less the server's reasoning count: vLLM counts the </think>
    # markup as neither, so it falls here) and each channel's token ITL (channel_gaps).
    answer_tokens: int | None = None
    reasoning_itl_ms: float | None = None
    answer_itl_ms: float | None = None


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is unknown or den is not positive: the one ratio of two figures
    (per-request rates, speedups, new-vs-base factors), so none of them divides by a zero or a gap."""
    return float(num / den) if num is not None and den is not None and den > 0 else None


def speedup(base: float | None, new: float | None, lower_is_better: bool) -> float | None:
    """How many times better new is than base (>1 better, <1 worse), whatever the metric's direction;
    None when either is unknown or not positive (nothing is infinitely better than zero)."""
    factor = ratio(base, new) if lower_is_better else ratio(new, base)
    return factor if factor else None


def request_metrics(record: RequestRecord) -> RequestMetrics:
    """Metrics for one record; never raises on degenerate input.

    A failed request keeps only what was seen (chunk count, token source): its partial stream has no
    latency profile worth averaging, and letting it into variant summaries would skew them.
    """
    t, cumulative, source = token_counts(record)
    n = len(t)
    empty = RequestMetrics(None, None, None, None, None, None, None, None, None, None, n, source)
    if record.status != Status.OK or n == 0:
        return empty

    ttft = float(t[0])
    completion_tokens = (
        record.completion_tokens if record.completion_tokens is not None else int(cumulative[-1])
    )
    decode_ms = float(t[-1] - t[0])
    decode_tokens = int(cumulative[-1] - cumulative[0])
    # A decode no clock saw, every token after the first arriving in the first one's read (a server
    # that flushed the whole reply at once), has no ITL: 0 ms would rank it the fastest of all.
    seen = decode_ms > 0
    itl = ratio(decode_ms, decode_tokens) if seen else None
    chunk_itl = ratio(decode_ms, n - 1) if seen else None
    channels = channel_gaps(record)
    tpot = None
    if record.e2e_ms is not None:
        tpot = ratio(record.e2e_ms - ttft, completion_tokens - 1)
    return RequestMetrics(
        ttft_ms=ttft,
        itl_ms=itl,
        chunk_itl_ms=chunk_itl,
        itl_inflation=ratio(chunk_itl, itl),
        tokens_per_chunk=float(cumulative[-1] / n),
        decode_tokens_per_chunk=ratio(decode_tokens, n - 1),
        tpot_ms=tpot,
        e2e_ms=record.e2e_ms,
        decode_tokens_per_s=ratio(decode_tokens * 1000.0, decode_ms),
        completion_tokens=completion_tokens,
        content_chunks=n,
        token_source=source,
        ttfa_ms=answer_ms(record) if record.reasoning else None,
        reasoning_tokens=record.reasoning_tokens if record.reasoning else None,
        answer_tokens=(
            completion_tokens - record.reasoning_tokens
            if record.reasoning and record.reasoning_tokens is not None
            else None
        ),
        reasoning_itl_ms=_channel_itl(*channels["reasoning"]) if channels else None,
        answer_itl_ms=_channel_itl(*channels["answer"]) if channels else None,
    )


PERCENTILES = (50, 90, 99)


def _weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, percentiles: Sequence[float] = PERCENTILES
) -> list[float]:
    """np.percentile's linear interpolation over `values` each repeated `weights` times, without
    building the repeated array (a long run has millions of token gaps)."""
    order = np.argsort(values, kind="stable")
    ordered, ends = values[order], np.cumsum(weights[order])
    out = []
    for q in percentiles:
        position = q / 100 * (ends[-1] - 1)
        low, high = int(np.floor(position)), int(np.ceil(position))
        at_low = ordered[np.searchsorted(ends, low, side="right")]
        at_high = ordered[np.searchsorted(ends, high, side="right")]
        out.append(float(at_low + (at_high - at_low) * (position - low)))
    return out


def distribution(
    values: Sequence[float | None] | np.ndarray,
    weights: Sequence[int] | np.ndarray | None = None,
    extra: Sequence[float] = (),
) -> dict[str, float | int | None]:
    """count/mean/std/p50/p90/p99 of the defined values, each counted `weights` times (integers; all
    1 when None), as np.mean/np.std/np.percentile give them on the repeated values: vllm bench's
    statistics. Undefined values are dropped, not counted as zero; `count` is the weighted count.
    `extra` percentiles (--metric-percentiles) come beside them, keyed as vllm bench keys them."""
    raw = (
        values.astype(float)  # pooled gaps: half a million at 1024 x 500, never walked one by one
        if isinstance(values, np.ndarray) and values.dtype != object
        else np.array([np.nan if v is None else v for v in values], dtype=float)
    )
    counts = np.ones(raw.size, dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    keep = ~np.isnan(raw) & (counts > 0)
    kept, counts = raw[keep], counts[keep]
    keys = [percentile_key(q) for q in (*PERCENTILES, *extra)]
    if kept.size == 0:
        return {"count": 0, "mean": None, "std": None, **dict.fromkeys(keys)}
    mean = float(np.average(kept, weights=counts))
    std = float(np.sqrt(np.average((kept - mean) ** 2, weights=counts)))
    found = _weighted_percentiles(kept, counts, (*PERCENTILES, *extra))
    return {"count": int(counts.sum()), "mean": mean, "std": std, **dict(zip(keys, found, strict=True))}


def summarize(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """count/mean/p50/p90/p99 over the defined values (distribution() without std): summary.json's
    per-request figures, one value per request."""
    figures = distribution(values)
    del figures["std"]
    return figures


def median(values: Sequence[float | None]) -> float | None:
    """summarize()'s p50 alone: the median of the defined values, None when there are none."""
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def p50(block: Mapping[str, Mapping[str, float | int | None]], key: str) -> float | None:
    """A block's p50 of `key` (a variant's distributions by summary.json key, a sweep point), None
    when it is absent."""
    value = (block.get(key) or {}).get("p50")
    return None if value is None else float(value)


def variant_summary(metrics: Sequence[RequestMetrics]) -> dict[str, dict[str, float | int | None]]:
    """summarize() of each SUMMARY_METRICS field across a variant's requests."""
    return {name: summarize([getattr(m, name) for m in metrics]) for name in SUMMARY_METRICS}
