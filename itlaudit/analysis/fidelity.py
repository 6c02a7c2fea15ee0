"""How faithfully a client stamped a stream, graded against the server's own send log: pure functions.

A client cannot be more exact than the moment bytes reach it, and a server's send times are the only
truth about when they left. Both sides use the host's monotonic clock but never a shared origin: every
figure here is a difference within one response. Added lag of a chunk = (its arrival − the response's
first arrival) − (its send − the first send): zero for a client that stamps at the socket with an idle
loop, and exactly the extra queueing delay otherwise. Chunks are joined on the cumulative token count
both sides know, so a client that dropped or merged a chunk shows up as missing, not as shifted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from itlaudit.model.sendlog import ResponseSends, SendLog

LAG_BUDGET_MS = 1.0  # the p99 added lag a faithful client keeps (issue 13)


@dataclass(frozen=True)
class ChunkJoin:
    """One response's content chunks that both sides saw, in send order."""

    arrival_ms: np.ndarray
    sent_ns: np.ndarray
    tokens: np.ndarray
    missing: int  # chunks the server sent that the client has no stamp for


def join_chunks(
    client_t_ms: Sequence[float], client_tokens: Sequence[int | None], sends: ResponseSends
) -> ChunkJoin:
    """Pair each sent chunk with the client's stamp of the chunk that first reported its token count."""
    stamp_of: dict[int, float] = {}
    for t, count in zip(client_t_ms, client_tokens, strict=True):
        if count is not None and count not in stamp_of:
            stamp_of[count] = t
    arrival, sent, tokens = [], [], []
    for sent_ns, count in zip(sends.sent_ns, sends.tokens, strict=True):
        if count in stamp_of:
            arrival.append(stamp_of[count])
            sent.append(sent_ns)
            tokens.append(count)
    return ChunkJoin(
        arrival_ms=np.asarray(arrival, dtype=float),
        sent_ns=np.asarray(sent, dtype=np.int64),
        tokens=np.asarray(tokens, dtype=np.int64),
        missing=len(sends.tokens) - len(tokens),
    )


def added_lag_ms(arrival_ms: np.ndarray, sent_ns: np.ndarray) -> np.ndarray:
    """Per chunk after the first: how much later it arrived than its send time says it could have."""
    if len(arrival_ms) < 2:
        return np.empty(0)
    arrival_gap = arrival_ms[1:] - arrival_ms[0]
    send_gap = (sent_ns[1:] - sent_ns[0]) / 1e6
    lag: np.ndarray = arrival_gap - send_gap
    return lag


def token_itl_ms(t_ms: np.ndarray, tokens: np.ndarray) -> float | None:
    """(t_last − t_first) / (C_last − C_first): metrics.request_metrics' token ITL, for any time series."""
    if len(t_ms) < 2 or tokens[-1] <= tokens[0]:
        return None
    return float((t_ms[-1] - t_ms[0]) / (tokens[-1] - tokens[0]))


def true_token_itl_ms(join: ChunkJoin) -> float | None:
    return token_itl_ms(join.sent_ns / 1e6, join.tokens)


@dataclass(frozen=True)
class Fidelity:
    """A client's grade over one run."""

    responses: int
    chunks: int
    missing_chunks: int
    unmatched_responses: int  # sent responses the client has no record of
    lag_min_ms: float | None  # below zero: the first chunk was stamped late, which flatters the rest
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    worst_itl_error: float | None  # |reported / true − 1|, worst request
    worst_response: str | None

    @property
    def every_chunk_stamped(self) -> bool:
        return self.missing_chunks == 0 and self.unmatched_responses == 0

    @property
    def within_budget(self) -> bool:
        """p99 within budget, and no first chunk stamped so late that negative lags hide the rest."""
        if self.lag_p99_ms is None or self.lag_min_ms is None or not self.every_chunk_stamped:
            return False
        return self.lag_p99_ms <= LAG_BUDGET_MS and self.lag_min_ms >= -LAG_BUDGET_MS


def grade(
    joins: Mapping[str, ChunkJoin], reported_itl_ms: Mapping[str, float | None], sent: SendLog
) -> Fidelity:
    """Pool every chunk's added lag over the run; the ITL error is per request, judged at its worst.

    `reported_itl_ms` is what the client itself says each response's token ITL was (for itlaudit, its
    derived `itl_ms`); a response it reports no ITL for counts as an infinite error, not as no error.
    """
    lags = [added_lag_ms(j.arrival_ms, j.sent_ns) for j in joins.values()]
    pooled = np.concatenate(lags) if lags else np.empty(0)
    worst, worst_id = None, None
    for rid, join in joins.items():
        truth = true_token_itl_ms(join)
        if truth is None:
            continue
        reported = reported_itl_ms.get(rid)
        error = float("inf") if reported is None else abs(reported / truth - 1.0)
        if worst is None or error > worst:
            worst, worst_id = error, rid
    low = p50 = p99 = top = None
    if pooled.size:
        p50, p99 = (float(v) for v in np.percentile(pooled, [50, 99]))
        low, top = float(pooled.min()), float(pooled.max())
    return Fidelity(
        responses=len(joins),
        chunks=sum(len(j.tokens) for j in joins.values()),
        missing_chunks=sum(j.missing for j in joins.values()),
        unmatched_responses=sum(1 for rid in sent.responses if rid not in joins),
        lag_min_ms=low,
        lag_p50_ms=p50,
        lag_p99_ms=p99,
        lag_max_ms=top,
        worst_itl_error=worst,
        worst_response=worst_id,
    )


@dataclass(frozen=True)
class SendLag:
    """The server's own lag behind its schedule: how far the stick itself bends."""

    chunks: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def send_lag(sent: SendLog, response_ids: Sequence[str] | None = None) -> SendLag:
    ids = sent.responses if response_ids is None else response_ids
    parts = [
        (np.asarray(sent.responses[rid].sent_ns) - np.asarray(sent.responses[rid].due_ns)) / 1e6
        for rid in ids
        if rid in sent.responses
    ]
    lag = np.concatenate(parts) if parts else np.empty(0)
    if not lag.size:
        return SendLag(0, None, None, None)
    p50, p99 = (float(v) for v in np.percentile(lag, [50, 99]))
    return SendLag(int(lag.size), p50, p99, float(lag.max()))
