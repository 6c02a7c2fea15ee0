"""Per-request rules on how a stream was delivered and counted: usage counts, how the request ended on
the wire, chunks that arrived together, and a capture loop that fell behind. Pure: record and metrics
in, findings out (findings.request_findings runs them all)."""

from __future__ import annotations

import numpy as np

from itlaudit.analysis.metrics import (
    TOKEN_SOURCE_CHUNKS,
    TOKEN_SOURCE_TOKENIZER,
    TOKEN_SOURCE_USAGE,
    RequestMetrics,
    token_counts,
)
from itlaudit.model.codes import (
    CHOICES_INTERLEAVED,
    CHUNKS_COALESCED,
    CLIENT_SATURATED,
    CONNECTION_ERROR,
    CUT_BY_DURATION,
    HTTP_ERROR,
    INVALID_UTF8,
    NO_DONE_SENTINEL,
    RATE_LIMITED,
    STREAM_ERROR,
    STREAM_STALLED,
    USAGE_MISSING,
    USAGE_NON_MONOTONIC,
    Finding,
    Severity,
)
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import DURATION_CUT, RequestRecord, Status
from itlaudit.model.vocabulary import StampMode

# Chunks that arrive in the same socket read as the previous one were not timed separately. A few
# happen under any load; past a quarter of the gaps the per-chunk series shows delivery bursts, not
# engine steps (seen for real: a starved 2-core vLLM CPU server flushed 257 chunks in one read).
COALESCED_MAX_SHARE = 0.25
COALESCED_MIN_GAPS = 4
# With loop stamps, the capture loop's lag (p99 over the stream) shifts chunk stamps by about that much:
# past 5% of the token ITL the client, not the server, is a visible part of the figure. Kernel stamps do
# not move with the loop's lag; there the client only distorts once its reads fall a whole token behind
# (a filling socket buffer then slows the server's sends), so the line is 100% of the token ITL.
CLIENT_SATURATED_SHARE = 0.05
CLIENT_SATURATED_SHARE_KERNEL = 1.0


def tokens_text(tokens: int | None) -> str:
    return "an unknown number of" if tokens is None else str(tokens)


def usage_missing_finding(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    # Fires whenever per-chunk counts are absent, including include_usage without continuous usage
    # stats: a final total alone cannot say how many tokens each chunk carried.
    if (
        record.status != Status.OK
        or metrics.content_chunks == 0
        or metrics.token_source == TOKEN_SOURCE_USAGE
    ):
        return None
    at_end_only = record.completion_tokens is not None
    if metrics.token_source == TOKEN_SOURCE_CHUNKS:
        severity = Severity.ERROR
        # A total in the last chunk only (a server that ignores continuous_usage_stats: SGLang builds
        # without it) says how many tokens came, never which chunk carried them: not spread, not guessed.
        sent = (
            f"The server's usage came only at the end ({record.completion_tokens} tokens, in its last "
            "chunk), so tokens cannot be spread over chunks"
            if at_end_only
            else "The server sent no per-chunk usage"
        )
        message = (
            f"{sent}; ITL counts {metrics.content_chunks} chunks as tokens: it is chunk-based, inflated "
            "under speculative decoding, and not comparable (--tokenizer estimates per-chunk counts; "
            "with SGLang, endpoint = 'generate' carries them)."
        )
    elif metrics.token_source == TOKEN_SOURCE_TOKENIZER:
        # Re-tokenized text is the model's own tokens where its output re-encodes to itself; the
        # server's final total, where it sent one, says how near that came.
        severity = Severity.WARNING
        counted = int(token_counts(record)[1][-1])
        scaled = "" if record.completion_tokens is None else ", spread as the re-encoded text spreads them"
        message = (
            f"The server sent no per-chunk usage or token ids; ITL counts {counted} tokens over "
            f"{metrics.content_chunks} chunks from the local tokenizer (--tokenizer){scaled}: "
            "an estimate of how many each chunk carried."
        )
    else:
        # Token ids still count every token, so the ITL stays token-true; worth knowing, not wrong.
        severity = Severity.WARNING
        message = (
            f"The server sent no per-chunk usage; ITL counts the returned token ids over "
            f"{metrics.content_chunks} chunks instead of the server's usage."
        )
    evidence: JSONObject = {
        "token_source": metrics.token_source,
        "content_chunks": metrics.content_chunks,
        "final_completion_tokens": record.completion_tokens,
        "usage_at_end_only": at_end_only,
    }
    return Finding.of(USAGE_MISSING, message, evidence, record.request_id, severity=severity)


def usage_non_monotonic_finding(record: RequestRecord) -> Finding | None:
    known = [(i, c) for i, c in enumerate(record.chunks.completion_tokens) if c is not None]
    if len(known) < 2:
        return None
    counts = np.array([c for _, c in known])
    drops = np.flatnonzero(np.diff(counts) < 0)
    if drops.size == 0:
        return None
    first = int(drops[0])
    index, value = known[first + 1]
    previous = known[first][1]
    message = (
        f"usage.completion_tokens went from {previous} down to {value} at chunk {index}: the server's "
        "cumulative counts, and the ITL built on them, cannot be trusted."
    )
    evidence = {"chunk_index": index, "previous": previous, "value": value, "decreases": int(drops.size)}
    return Finding.of(USAGE_NON_MONOTONIC, message, evidence, record.request_id)


def coalesced_finding(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    t_ms, _, _ = token_counts(record)
    gaps = np.diff(t_ms)
    if gaps.size < COALESCED_MIN_GAPS:
        return None
    same_read = int(np.count_nonzero(gaps == 0))
    share = same_read / gaps.size
    if share <= COALESCED_MAX_SHARE:
        return None
    _, burst_sizes = np.unique(t_ms, return_counts=True)
    busy = client_saturated_finding(record, metrics) is not None
    blame = (
        "the client's loop was saturated during the stream, so it may be the bottleneck"
        if busy
        else "the client's loop kept up, so the server or the network sent them in bursts"
    )
    message = (
        f"{same_read} of {gaps.size} chunk gaps were zero "
        f"(up to {int(burst_sizes.max())} chunks in one read): "
        f"per-chunk timing shows delivery bursts, not engine steps; {blame}."
    )
    evidence = {
        "zero_gaps": same_read,
        "gaps": int(gaps.size),
        "share": share,
        "largest_burst": int(burst_sizes.max()),
        "loop_lag_p99_ms": record.loop_lag_p99_ms,
    }
    return Finding.of(CHUNKS_COALESCED, message, evidence, record.request_id)


def transport_findings(record: RequestRecord, metrics: RequestMetrics) -> list[Finding]:
    """Findings about how the request ended on the wire rather than what it generated."""
    out = []
    rid = record.request_id
    seen: JSONObject = {
        "completion_tokens": record.completion_tokens,
        "content_chunks": metrics.content_chunks,
    }
    before = tokens_text(record.completion_tokens)
    if record.status == Status.STREAM_ERROR:
        message = f"The stream failed after {before} tokens: {record.error}"
        out.append(Finding.of(STREAM_ERROR, message, {"message": record.error, **seen}, rid))
    elif record.status == Status.HTTP_ERROR:
        message = f"The server answered HTTP {record.http_status}: {record.error}"
        evidence: JSONObject = {"http_status": record.http_status, "message": record.error}
        out.append(Finding.of(HTTP_ERROR, message, evidence, rid))
    elif record.status == Status.CONNECTION_ERROR:
        message = f"The connection failed after {before} tokens: {record.error}"
        out.append(Finding.of(CONNECTION_ERROR, message, {"message": record.error, **seen}, rid))
    elif record.status == Status.TIMEOUT:
        out.append(_cut(record, seen) if record.timeout_limit == DURATION_CUT else _stalled(record, seen))
    elif record.status == Status.RATE_LIMITED:
        retry = record.retry_after_s
        message = (
            f"The server answered HTTP {record.http_status} (rate limited"
            + (f", Retry-After {retry:g} s" if retry is not None else ", no Retry-After")
            + f"): {record.error}. The workload went on; this request was not measured."
        )
        evidence = {"http_status": record.http_status, "retry_after_s": retry, "message": record.error}
        out.append(Finding.of(RATE_LIMITED, message, evidence, rid))
    if record.invalid_utf8_chunks:
        message = (
            f"{record.invalid_utf8_chunks} chunk(s) were not valid UTF-8; their text was kept with U+FFFD "
            "in place of the bad bytes, so the output text is not what the server's bytes said."
        )
        evidence = {"chunks": record.invalid_utf8_chunks}
        out.append(Finding.of(INVALID_UTF8, message, evidence, rid))
    if record.other_index_chunks:
        message = (
            f"{record.other_index_chunks} chunk(s) carried a choices[].index other than 0: the server "
            "interleaved several replies (n > 1) into this stream, so it is not one reply and its "
            "figures are left out; only index 0's text is kept."
        )
        evidence = {"chunks": record.other_index_chunks, **seen}
        out.append(Finding.of(CHOICES_INTERLEAVED, message, evidence, rid))
    if record.status in (Status.OK, Status.STREAM_ERROR) and not record.done_sentinel:
        message = (
            f"The stream closed without 'data: [DONE]' (status {record.status}), so it may have been cut off."
        )
        out.append(Finding.of(NO_DONE_SENTINEL, message, {"status": record.status, **seen}, rid))
    return out


def _cut(record: RequestRecord, seen: JSONObject) -> Finding:
    """The run's end cut the request: not a silence of the server's, so not a stall."""
    message = (
        f"Still streaming after {tokens_text(record.completion_tokens)} tokens when the run's duration_s "
        f"and its grace ran out: {record.error}. Not measured; everything received is kept."
    )
    evidence = {"e2e_ms": record.e2e_ms, "sent_offset_ms": record.sent_offset_ms, **seen}
    return Finding.of(CUT_BY_DURATION, message, evidence, record.request_id)


def _stalled(record: RequestRecord, seen: JSONObject) -> Finding:
    """A timeout cut the request: how long the silence was, and after how much output."""
    last_ms = record.chunks.t_ms[-1] if len(record.chunks) else 0.0
    gap_ms = (record.e2e_ms or 0.0) - last_ms
    before = tokens_text(record.completion_tokens)
    message = (
        f"The request was cut by {record.timeout_limit} after {before} tokens: nothing arrived for "
        f"{gap_ms / 1000:.3g} s ({record.error}). Everything received before is kept."
    )
    evidence = {"limit": record.timeout_limit, "gap_ms": gap_ms, "e2e_ms": record.e2e_ms, **seen}
    return Finding.of(STREAM_STALLED, message, evidence, record.request_id)


def client_saturated_finding(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    lag = record.loop_lag_p99_ms
    itl = metrics.itl_ms
    share = CLIENT_SATURATED_SHARE_KERNEL if record.stamp == StampMode.KERNEL else CLIENT_SATURATED_SHARE
    if lag is None or itl is None or itl <= 0 or lag <= share * itl:
        return None
    message = (
        f"itlaudit's own capture loop lagged {lag:.3g} ms (p99; max {record.loop_lag_max_ms or lag:.3g} "
        f"ms) during this stream, {lag / itl:.0%} of its {itl:.3g} ms token ITL: the client, not only the "
        "server, is in this figure. Rerun with more --workers or fewer concurrent streams."
    )
    evidence = {
        "loop_lag_p99_ms": lag,
        "loop_lag_max_ms": record.loop_lag_max_ms,
        "itl_ms": itl,
        "share": lag / itl,
        "threshold_share": share,
        "stamp": record.stamp,
    }
    return Finding.of(CLIENT_SATURATED, message, evidence, record.request_id)
