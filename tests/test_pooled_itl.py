"""Pooled ITL percentiles on a hand-computed case: every chunk gap of every request, per chunk (vllm
bench's ITL) and per token (each gap over its tokens, counted that many times), against the
per-request distribution they must not be confused with."""

from __future__ import annotations

import numpy as np
import pytest

from itlaudit.analysis.benchmark import benchmark_figures
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.metrics import decode_gaps, distribution, request_metrics
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status


def request(index: int, t_ms: list[float], tokens: list[int], status: Status = Status.OK) -> RequestRecord:
    """A stream whose content chunks arrive at t_ms carrying the server's cumulative counts `tokens`."""
    return RequestRecord(
        request_id=f"A-{index}",
        variant="A",
        endpoint="completions",
        url="http://127.0.0.1:1/v1/completions",
        model="tiny",
        params=RequestParams(),
        status=status,
        completion_tokens=tokens[-1],
        e2e_ms=t_ms[-1] + 1.0,
        chunks=ChunkSeries(
            t_ms=t_ms,
            completion_tokens=list(tokens),
            text_len=[1] * len(t_ms),
            has_choice=[True] * len(t_ms),
            token_ids=[None] * len(t_ms),
        ),
    )


# Request 0: a 4-token chunk 12 ms after the first token, then two 1-token chunks 4 ms apart:
# chunk gaps 12, 4, 4; token gaps 3, 3, 3, 3, 4, 4. Request 1: 1-token chunks 10 ms and 20 ms apart.
RECORDS = [
    request(0, [10.0, 22.0, 26.0, 30.0], [1, 5, 6, 7]),
    request(1, [20.0, 30.0, 50.0], [2, 3, 4]),
    request(2, [5.0, 500.0], [1, 2], status=Status.STREAM_ERROR),  # failed: in no pooled figure
]
TOKEN_GAPS = [3.0, 3.0, 3.0, 3.0, 4.0, 4.0, 10.0, 20.0]
CHUNK_GAPS = [12.0, 4.0, 4.0, 10.0, 20.0]


def test_decode_gaps_are_each_chunk_gap_and_its_token_increment() -> None:
    gaps, increments = decode_gaps(RECORDS[0])
    assert gaps.tolist() == [12.0, 4.0, 4.0]
    assert increments.tolist() == [4, 1, 1]


def test_pooled_token_itl_counts_a_4_token_chunk_as_four_gaps() -> None:
    figures = benchmark_figures(RECORDS, [request_metrics(r) for r in RECORDS])
    token = figures["token_itl_ms"]
    assert token["count"] == 8
    assert token["mean"] == pytest.approx(50 / 8)
    # sorted 3 3 3 3 4 4 10 20; linear interpolation at 3.5, 6.3 and 6.93 of 7
    assert token["p50"] == pytest.approx(3.5)
    assert token["p90"] == pytest.approx(10 + 0.3 * 10)
    assert token["p99"] == pytest.approx(10 + 0.93 * 10)
    assert token["std"] == pytest.approx(float(np.std(TOKEN_GAPS)))


def test_pooled_chunk_itl_is_vllm_bench_itl_one_value_per_chunk() -> None:
    figures = benchmark_figures(RECORDS, [request_metrics(r) for r in RECORDS])
    chunk = figures["chunk_itl_ms"]
    assert chunk["count"] == 5
    assert chunk["mean"] == pytest.approx(10.0)
    # sorted 4 4 10 12 20
    assert chunk["p50"] == pytest.approx(10.0)
    assert chunk["p90"] == pytest.approx(12 + 0.6 * 8)
    assert chunk["p99"] == pytest.approx(12 + 0.96 * 8)
    assert figures["decode_chunks"] == 5 and figures["tokens_per_decode_chunk"] == pytest.approx(8 / 5)


def test_per_request_p99_is_not_the_pooled_p99() -> None:
    """The K0 trap of issue 22: the p99 of per-request means hides the slow gaps that vllm bench's
    pooled P99 shows."""
    block = summarize_run(RECORDS).variants["A"]
    per_request = block.itl_ms  # each request's mean token ITL: 20/6 and 30/2
    assert per_request["count"] == 2
    assert per_request["p99"] == pytest.approx(20 / 6 + 0.99 * (15 - 20 / 6))
    pooled = block.benchmark["token_itl_ms"]
    assert isinstance(pooled, dict) and pooled["p99"] == pytest.approx(19.3)
    assert pooled["p99"] > per_request["p99"] + 4


def test_weighted_distribution_equals_numpy_on_the_repeated_values() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        values = rng.normal(10, 3, size=int(rng.integers(1, 40)))
        weights = rng.integers(1, 6, size=values.size)
        repeated = np.repeat(values, weights)
        figures = distribution(values, weights)
        expected = [*np.percentile(repeated, [50, 90, 99]), repeated.mean(), repeated.std()]
        got = [figures["p50"], figures["p90"], figures["p99"], figures["mean"], figures["std"]]
        assert got == pytest.approx(expected)
        assert figures["count"] == repeated.size


def test_distribution_of_nothing_is_all_none() -> None:
    assert distribution([None]) == {
        "count": 0,
        "mean": None,
        "std": None,
        "p50": None,
        "p90": None,
        "p99": None,
    }
    assert distribution(np.zeros(0), np.zeros(0, dtype=np.int64))["p99"] is None
