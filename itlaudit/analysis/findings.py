"""Findings: pure rules that say when a benchmark number cannot be taken at face value.

A latency comparison is only meaningful when both sides generated what was asked for and the token
counts behind the ITL are the server's own. These rules look for the ways that silently fails: an
output cut short (vLLM #47297: a K=3 MTP "regression" from 10 ms to 72 ms ITL was a server stopping at
128 tokens), ignored sampling limits, and streams whose usage counts are missing or inconsistent.
Every finding carries the numbers that made it fire, so a reader can check the rule, not trust it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from itlaudit.analysis.metrics import TOKEN_SOURCE_CHUNKS, TOKEN_SOURCE_USAGE, RequestMetrics, token_counts
from itlaudit.analysis.quality import DEFAULT_THRESHOLDS, GibberishThresholds, gibberish_reasons, text_quality
from itlaudit.model.codes import (
    CHUNKS_COALESCED,
    CLIENT_SATURATED,
    COMMON_CAP,
    CONNECTION_ERROR,
    GIBBERISH_SUSPECTED,
    HTTP_ERROR,
    IGNORE_EOS_VIOLATED,
    INVALID_UTF8,
    MIN_TOKENS_VIOLATED,
    NO_DONE_SENTINEL,
    RATE_LIMITED,
    REGISTRY,
    STOP_REASON_UNEXPECTED,
    STOP_TOKEN_IDS_IGNORED,
    STREAM_ERROR,
    STREAM_STALLED,
    TRUNCATED_BELOW_MAX_TOKENS,
    TRUNCATION_CODES,
    USAGE_MISSING,
    USAGE_NON_MONOTONIC,
    Scope,
    Severity,
    codes_in,
)
from itlaudit.model.records import RequestRecord, Status

# STREAM_ERROR and the other codes below are re-exported for bisect/verdict.py, which reads them here.
__all__ = [
    "CODES",
    "CONNECTION_ERROR",
    "HTTP_ERROR",
    "NO_DONE_SENTINEL",
    "STREAM_ERROR",
    "TRUNCATION_CODES",
    "Finding",
    "completions_default_stop",
    "request_findings",
    "run_findings",
    "truncated_requests",
]

# The codes these rules emit (the comparison codes come from comparison and lossless).
CODES = codes_in(Scope.REQUEST, Scope.VARIANT)

# A shared cap needs repeated evidence: one or two requests ending at the same length can be chance
# (and each is already reported by truncated_below_max_tokens); three at an identical count is a limit.
COMMON_CAP_MIN_REQUESTS = 3
# At least half of the finished requests must hit the cap for it to explain the variant's numbers
# rather than a handful of outliers.
COMMON_CAP_MIN_SHARE = 0.5
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


@dataclass(frozen=True)
class Finding:
    """One judgement about a request (request_id set) or a whole variant (request_id None)."""

    code: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None

    @classmethod
    def of(
        cls,
        code: str,
        message: str,
        evidence: dict[str, Any],
        request_id: str | None = None,
        *,
        severity: Severity | None = None,
    ) -> Finding:
        """A finding of a registered code, at the registry's severity unless the rule picks another
        one the registry allows: the registry, not each rule, says how bad a code is."""
        entry = REGISTRY[code]
        if severity is None:
            severity = entry.severity
        elif severity not in entry.severities:
            raise ValueError(f"{code} is registered as {'/'.join(entry.severities)}, not {severity}")
        return cls(code, severity, message, evidence, request_id)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        """Inverse of to_json (compare.json's findings are re-scored after they are written)."""
        return cls(**{**data, "severity": Severity(data["severity"])})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _exact_tokens(record: RequestRecord, metrics: RequestMetrics) -> int | None:
    """The completion length when it is really known: a chunk count undercounts MTP output and would
    turn every speculative run into a false truncation."""
    if record.completion_tokens is not None:
        return record.completion_tokens
    return metrics.completion_tokens if metrics.token_source != TOKEN_SOURCE_CHUNKS else None


def _cut_short(record: RequestRecord, tokens: int | None) -> bool:
    """finish "length" that max_tokens does not explain: the server applied a cap of its own."""
    if record.finish_reason != "length":
        return False
    max_tokens = record.params.max_tokens
    return max_tokens is None or (tokens is not None and tokens < max_tokens)


def _tokens_text(tokens: int | None) -> str:
    return "an unknown number of" if tokens is None else str(tokens)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _returned_ids(record: RequestRecord) -> list[int] | None:
    chunks = record.chunks
    per_chunk = [ids for ids, choice in zip(chunks.token_ids, chunks.has_choice, strict=True) if choice]
    if all(ids is None for ids in per_chunk):
        return None
    return [tok for ids in per_chunk if ids is not None for tok in ids]


# The OpenAI completions API's default max_tokens, which vLLM's /v1/completions applies when a request
# omits it (chat has no such default): a stop at exactly 16 is that default, not a generation config.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def completions_default_stop(endpoint: str, max_tokens: int | None, tokens: int | None) -> bool:
    """A /v1/completions request without max_tokens that ended at the API's default of 16."""
    return endpoint == "completions" and max_tokens is None and tokens == COMPLETIONS_DEFAULT_MAX_TOKENS


COMPLETIONS_DEFAULT_TEXT = (
    f"{COMPLETIONS_DEFAULT_MAX_TOKENS} is vLLM's default max_tokens for /v1/completions (the OpenAI "
    "API's) when a request omits it: set max_tokens in the scenario's [workload]"
)


def _truncated(record: RequestRecord, tokens: int | None) -> Finding | None:
    if not _cut_short(record, tokens):
        return None
    max_tokens = record.params.max_tokens
    if completions_default_stop(record.endpoint, max_tokens, tokens):
        message = (
            f"finish_reason is 'length' after {tokens} tokens and the request set no max_tokens: "
            f"{COMPLETIONS_DEFAULT_TEXT}."
        )
    elif max_tokens is None:
        message = (
            f"finish_reason is 'length' after {_tokens_text(tokens)} tokens although the request set no "
            "max_tokens: a server-side cap (e.g. generation_config max_new_tokens) ended the output."
        )
    else:
        message = (
            f"finish_reason is 'length' after {tokens} tokens, below the requested max_tokens {max_tokens}: "
            "the server stopped the output early, so its latency is not comparable."
        )
    evidence = {
        "cap": tokens,
        "max_tokens": max_tokens,
        "request_set_max_tokens": max_tokens is not None,
        "completions_default": completions_default_stop(record.endpoint, max_tokens, tokens),
    }
    return Finding.of(TRUNCATED_BELOW_MAX_TOKENS, message, evidence, record.request_id)


def _ignore_eos(record: RequestRecord, tokens: int | None) -> Finding | None:
    params = record.params
    if not params.ignore_eos or record.finish_reason != "stop":
        return None
    if _is_int(record.stop_reason) and record.stop_reason in params.stop_token_ids:
        return None
    message = (
        f"ignore_eos was set but the output stopped (finish_reason 'stop', stop_reason "
        f"{record.stop_reason!r}) after {_tokens_text(tokens)} tokens, so the length is not what the "
        "benchmark asked for."
    )
    evidence = {
        "finish_reason": record.finish_reason,
        "stop_reason": record.stop_reason,
        "completion_tokens": tokens,
        "max_tokens": params.max_tokens,
    }
    return Finding.of(IGNORE_EOS_VIOLATED, message, evidence, record.request_id)


def _min_tokens(record: RequestRecord, tokens: int | None) -> Finding | None:
    min_tokens = record.params.min_tokens
    if min_tokens is None or record.status != Status.OK or tokens is None or tokens >= min_tokens:
        return None
    message = f"The request asked for min_tokens {min_tokens} but finished after {tokens} tokens."
    evidence = {"min_tokens": min_tokens, "completion_tokens": tokens, "finish_reason": record.finish_reason}
    return Finding.of(MIN_TOKENS_VIOLATED, message, evidence, record.request_id)


def _stop_ids_ignored(record: RequestRecord) -> Finding | None:
    stop_ids = set(record.params.stop_token_ids)
    ids = _returned_ids(record)
    if not stop_ids or ids is None:
        return None
    # Inside the first min_tokens tokens a stop id is legitimately not a stop; the last token may be the
    # stop itself on a normal "stop" finish, but not when the output ran on to the length limit.
    first = record.params.min_tokens or 0
    last = len(ids) if record.finish_reason == "length" else len(ids) - 1
    hits = [pos for pos in range(first, last) if ids[pos] in stop_ids]
    if not hits:
        return None
    pos = hits[0]
    message = (
        f"Requested stop token {ids[pos]} appears at position {pos} of {len(ids)} returned tokens "
        f"(finish_reason {record.finish_reason!r}), but generation did not stop there."
    )
    evidence = {
        "position": pos,
        "token_id": ids[pos],
        "occurrences": len(hits),
        "returned_tokens": len(ids),
        "min_tokens": record.params.min_tokens,
        "finish_reason": record.finish_reason,
        "stop_token_ids": sorted(stop_ids),
    }
    return Finding.of(STOP_TOKEN_IDS_IGNORED, message, evidence, record.request_id)


def _stop_reason(record: RequestRecord) -> Finding | None:
    finish, reason = record.finish_reason, record.stop_reason
    stop_ids = record.params.stop_token_ids
    if finish == "stop" and _is_int(reason) and reason not in stop_ids:
        message = f"The output stopped on token {reason}, which is not among the requested stop_token_ids."
    elif reason is not None and finish in ("length", None):
        message = f"stop_reason is {reason!r} but finish_reason is {finish!r}: the two contradict each other."
    else:
        return None
    evidence = {"finish_reason": finish, "stop_reason": reason, "stop_token_ids": list(stop_ids)}
    return Finding.of(STOP_REASON_UNEXPECTED, message, evidence, record.request_id)


def _usage_missing(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    # Fires whenever per-chunk counts are absent, including include_usage without continuous usage
    # stats: a final total alone cannot say how many tokens each chunk carried.
    if (
        record.status != Status.OK
        or metrics.content_chunks == 0
        or metrics.token_source == TOKEN_SOURCE_USAGE
    ):
        return None
    if metrics.token_source == TOKEN_SOURCE_CHUNKS:
        severity = Severity.ERROR
        message = (
            f"The server sent no per-chunk usage, so ITL counts {metrics.content_chunks} chunks as tokens: "
            "it is chunk-based, inflated under speculative decoding, and not comparable."
        )
    else:
        # Token ids still count every token, so the ITL stays token-true; worth knowing, not wrong.
        severity = Severity.WARNING
        message = (
            f"The server sent no per-chunk usage; ITL counts the returned token ids over "
            f"{metrics.content_chunks} chunks instead of the server's usage."
        )
    evidence = {
        "token_source": metrics.token_source,
        "content_chunks": metrics.content_chunks,
        "final_completion_tokens": record.completion_tokens,
    }
    return Finding.of(USAGE_MISSING, message, evidence, record.request_id, severity=severity)


def _usage_non_monotonic(record: RequestRecord) -> Finding | None:
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


def _gibberish(record: RequestRecord, thresholds: GibberishThresholds) -> Finding | None:
    quality = text_quality(record.text)
    reasons = gibberish_reasons(quality, thresholds)
    if not reasons:
        return None
    message = (
        f"The output looks like numeric gibberish ({'; '.join(reasons)}): a decode path may be broken, "
        "so this server's latency is not worth comparing."
    )
    if record.params.ignore_eos:
        message += " It was generated with ignore_eos; confirm with natural EOS before blaming the server."
    evidence = {**quality.to_json(), "ignore_eos": record.params.ignore_eos, "thresholds": asdict(thresholds)}
    return Finding.of(GIBBERISH_SUSPECTED, message, evidence, record.request_id)


def _coalesced(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    t_ms, _, _ = token_counts(record)
    gaps = np.diff(t_ms)
    if gaps.size < COALESCED_MIN_GAPS:
        return None
    same_read = int(np.count_nonzero(gaps == 0))
    share = same_read / gaps.size
    if share <= COALESCED_MAX_SHARE:
        return None
    _, burst_sizes = np.unique(t_ms, return_counts=True)
    busy = _client_saturated(record, metrics) is not None
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


def _transport(record: RequestRecord, metrics: RequestMetrics) -> list[Finding]:
    """Findings about how the request ended on the wire rather than what it generated."""
    out = []
    rid = record.request_id
    seen = {"completion_tokens": record.completion_tokens, "content_chunks": metrics.content_chunks}
    before = _tokens_text(record.completion_tokens)
    if record.status == Status.STREAM_ERROR:
        message = f"The stream failed after {before} tokens: {record.error}"
        out.append(Finding.of(STREAM_ERROR, message, {"message": record.error, **seen}, rid))
    elif record.status == Status.HTTP_ERROR:
        message = f"The server answered HTTP {record.http_status}: {record.error}"
        evidence = {"http_status": record.http_status, "message": record.error}
        out.append(Finding.of(HTTP_ERROR, message, evidence, rid))
    elif record.status == Status.CONNECTION_ERROR:
        message = f"The connection failed after {before} tokens: {record.error}"
        out.append(Finding.of(CONNECTION_ERROR, message, {"message": record.error, **seen}, rid))
    elif record.status == Status.TIMEOUT:
        out.append(_stalled(record, seen))
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
    if record.status in (Status.OK, Status.STREAM_ERROR) and not record.done_sentinel:
        message = (
            f"The stream closed without 'data: [DONE]' (status {record.status}), so it may have been cut off."
        )
        out.append(Finding.of(NO_DONE_SENTINEL, message, {"status": record.status, **seen}, rid))
    return out


def _stalled(record: RequestRecord, seen: dict[str, Any]) -> Finding:
    """A timeout cut the request: how long the silence was, and after how much output."""
    last_ms = record.chunks.t_ms[-1] if len(record.chunks) else 0.0
    gap_ms = (record.e2e_ms or 0.0) - last_ms
    before = _tokens_text(record.completion_tokens)
    message = (
        f"The request was cut by {record.timeout_limit} after {before} tokens: nothing arrived for "
        f"{gap_ms / 1000:.3g} s ({record.error}). Everything received before is kept."
    )
    evidence = {"limit": record.timeout_limit, "gap_ms": gap_ms, "e2e_ms": record.e2e_ms, **seen}
    return Finding.of(STREAM_STALLED, message, evidence, record.request_id)


def _client_saturated(record: RequestRecord, metrics: RequestMetrics) -> Finding | None:
    lag = record.loop_lag_p99_ms
    itl = metrics.itl_ms
    share = CLIENT_SATURATED_SHARE_KERNEL if record.stamp == "kernel" else CLIENT_SATURATED_SHARE
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


def request_findings(
    record: RequestRecord, metrics: RequestMetrics, quality: GibberishThresholds = DEFAULT_THRESHOLDS
) -> list[Finding]:
    """Every per-request rule that fires for this record, in CODES order."""
    tokens = _exact_tokens(record, metrics)
    candidates = [
        _truncated(record, tokens),
        _ignore_eos(record, tokens),
        _min_tokens(record, tokens),
        _stop_ids_ignored(record),
        _stop_reason(record),
        _usage_missing(record, metrics),
        _usage_non_monotonic(record),
        _coalesced(record, metrics),
        _client_saturated(record, metrics),
    ]
    found = [f for f in candidates if f is not None] + _transport(record, metrics)
    gibberish = _gibberish(record, quality)
    return found + ([gibberish] if gibberish is not None else [])


def run_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """Run-level rules: a cap shared by most of a variant's requests explains its numbers wholesale.

    Only the server's own completion counts are used: equality at one value is the signal, and a
    chunk count could not show it.
    """
    by_variant: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)

    out = []
    for variant, group in by_variant.items():
        finished = [r for r in group if r.status == Status.OK]
        cut = [r for r in finished if r.completion_tokens is not None and _cut_short(r, r.completion_tokens)]
        if not cut:
            continue
        cap, hits = Counter(r.completion_tokens for r in cut).most_common(1)[0]
        share = hits / len(finished)
        if hits < COMMON_CAP_MIN_REQUESTS or share < COMMON_CAP_MIN_SHARE:
            continue
        at_cap = [r for r in cut if r.completion_tokens == cap]
        max_tokens = sorted({r.params.max_tokens for r in at_cap if r.params.max_tokens is not None})
        unset = sum(r.params.max_tokens is None for r in at_cap)
        asked = ", ".join([*map(str, max_tokens), *(["unset"] if unset else [])])
        default = unset == hits and all(
            completions_default_stop(r.endpoint, None, r.completion_tokens) for r in at_cap
        )
        cause = f": {COMPLETIONS_DEFAULT_TEXT}. That default" if default else ", so a server-side cap"
        message = (
            f"Variant {variant!r}: {hits} of {len(finished)} finished requests stopped at exactly {cap} "
            f"tokens with finish_reason 'length' (max_tokens requested: {asked}){cause}, "
            "not a latency change, explains this variant's numbers."
        )
        evidence = {
            "variant": variant,
            "cap": cap,
            "requests_at_cap": hits,
            "finished_requests": len(finished),
            "share": share,
            "max_tokens": max_tokens,
            "requests_without_max_tokens": unset,
            "completions_default": default,
            "request_ids": [r.request_id for r in at_cap],
        }
        out.append(Finding.of(COMMON_CAP, message, evidence))
    return out


def truncated_requests(findings: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The requests these findings (in their JSON form) call cut short: any of TRUNCATION_CODES."""
    return frozenset(
        str(f["request_id"]) for f in findings if f["code"] in TRUNCATION_CODES and f.get("request_id")
    )
