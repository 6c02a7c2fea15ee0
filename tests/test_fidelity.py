"""The fidelity maths on synthetic streams: a known injected delay must come out exactly, and nothing
else may come out of a perfect client."""

from __future__ import annotations

import math

import numpy as np
import pytest

from itlaudit.analysis.fidelity import Fidelity, added_lag_ms, grade, join_chunks, send_lag, token_itl_ms
from itlaudit.errors import RecordsError
from itlaudit.model.sendlog import ResponseSends, SendLog
from itlaudit.workflows.selfcheck import search_streams

PERIOD_NS = 2_000_000


def _sends(n: int, start_ns: int = 10_000_000_000, k: int = 1) -> ResponseSends:
    due = [start_ns + i * PERIOD_NS for i in range(n)]
    sent = [d + 50_000 for d in due]
    return ResponseSends(due_ns=due, sent_ns=sent, tokens=[k * (i + 1) for i in range(n)])


def _perfect_client(sends: ResponseSends, offset_ms: float = 7.25) -> tuple[list[float], list[int | None]]:
    """Stamps every chunk exactly at its send time, on a clock with another origin."""
    t = [(s - sends.sent_ns[0]) / 1e6 + offset_ms for s in sends.sent_ns]
    return t, list(sends.tokens)


def test_perfect_client_has_no_added_lag_and_no_itl_error() -> None:
    sends = _sends(100, k=3)
    t, tokens = _perfect_client(sends)
    join = join_chunks(t, tokens, sends)
    assert join.missing == 0
    lag = added_lag_ms(join.arrival_ms, join.sent_ns)
    assert len(lag) == 99
    np.testing.assert_allclose(lag, 0.0, atol=1e-9)
    log = SendLog(responses={"r": sends})
    result = grade({"r": join}, {"r": token_itl_ms(join.arrival_ms, join.tokens)}, log)
    assert result.lag_max_ms == pytest.approx(0.0, abs=1e-9)
    assert result.worst_itl_error == pytest.approx(0.0, abs=1e-12)
    assert result.every_chunk_stamped and result.within_budget


def test_injected_delay_shows_up_exactly() -> None:
    sends = _sends(50)
    t, tokens = _perfect_client(sends)
    t[20] += 3.5  # one chunk held 3.5 ms by the client
    for i in range(40, 50):
        t[i] += 12.0  # the last ten stamped after a 12 ms stall
    join = join_chunks(t, tokens, sends)
    lag = added_lag_ms(join.arrival_ms, join.sent_ns)
    expected = np.zeros(49)
    expected[19] = 3.5
    expected[39:] = 12.0
    np.testing.assert_allclose(lag, expected, atol=1e-9)
    true_itl = 2.0  # 49 gaps of 2 ms over 49 tokens
    measured = token_itl_ms(join.arrival_ms, join.tokens)
    assert measured == pytest.approx(true_itl + 12.0 / 49)
    result = grade({"r": join}, {"r": measured}, SendLog(responses={"r": sends}))
    assert result.lag_max_ms == pytest.approx(12.0)
    assert result.worst_itl_error == pytest.approx(12.0 / 49 / true_itl)
    assert not result.within_budget


def test_late_first_chunk_makes_the_rest_look_early() -> None:
    """The definition is relative to the first chunk, so a late first stamp shows as negative lag."""
    sends = _sends(10)
    t, tokens = _perfect_client(sends)
    t[0] += 2.0
    join = join_chunks(t, tokens, sends)
    np.testing.assert_allclose(added_lag_ms(join.arrival_ms, join.sent_ns), -2.0)
    result = grade(
        {"r": join}, {"r": token_itl_ms(join.arrival_ms, join.tokens)}, SendLog(responses={"r": sends})
    )
    assert result.lag_p99_ms == pytest.approx(-2.0)
    assert result.lag_min_ms == pytest.approx(-2.0)
    assert not result.within_budget  # a negative p99 is no proof of fidelity


def test_join_on_token_counts_skips_non_content_events_and_counts_missing_chunks() -> None:
    sends = _sends(5)
    t, _ = _perfect_client(sends)
    # A usage-only event repeats the last count, an event without usage has None, and chunk 3 is lost.
    client_t = [*t[:2], t[1] + 0.1, t[3], t[4], t[4] + 0.2]
    client_tokens: list[int | None] = [1, 2, None, 4, 5, 5]
    join = join_chunks(client_t, client_tokens, sends)
    assert join.tokens.tolist() == [1, 2, 4, 5]
    assert join.missing == 1
    np.testing.assert_allclose(added_lag_ms(join.arrival_ms, join.sent_ns), 0.0, atol=1e-9)
    result = grade({"r": join}, {"r": 2.0}, SendLog(responses={"r": sends, "lost": _sends(3)}))
    assert result.missing_chunks == 1
    assert result.unmatched_responses == 1
    assert not result.every_chunk_stamped and not result.within_budget


def test_a_response_without_reported_itl_is_the_worst() -> None:
    sends = _sends(5)
    t, tokens = _perfect_client(sends)
    join = join_chunks(t, tokens, sends)
    result = grade({"a": join, "b": join}, {"a": 2.0}, SendLog(responses={"a": sends, "b": sends}))
    assert math.isinf(result.worst_itl_error or 0.0)
    assert result.worst_response == "b"


def test_degenerate_series() -> None:
    assert added_lag_ms(np.array([1.0]), np.array([5])).size == 0
    assert token_itl_ms(np.array([1.0]), np.array([1])) is None
    assert token_itl_ms(np.array([1.0, 2.0]), np.array([3, 3])) is None
    empty = grade({}, {}, SendLog())
    assert empty.lag_p99_ms is None and not empty.within_budget


def test_send_lag_is_sent_minus_due() -> None:
    log = SendLog(responses={"a": _sends(10), "b": _sends(10)})
    log.responses["b"].sent_ns[4] += 3_000_000
    lag = send_lag(log)
    assert lag.chunks == 20
    assert lag.p50_ms == pytest.approx(0.05)
    assert lag.max_ms == pytest.approx(3.05)
    assert send_lag(log, ["a"]).max_ms == pytest.approx(0.05)


def test_send_log_round_trip_and_bad_file(tmp_path) -> None:
    log = SendLog(server={"kind": "truth"}, responses={"a": _sends(3)})
    path = tmp_path / "log.json"
    log.write(path)
    assert SendLog.load(path) == log
    path.write_text('{"format": "other"}')
    with pytest.raises(RecordsError, match="not a send log"):
        SendLog.load(path)


def _fidelity(p99: float) -> Fidelity:
    return Fidelity(1, 10, 0, 0, 0.0, 0.0, p99, p99, 0.0, "r")


def test_search_finds_the_last_stream_count_within_budget() -> None:
    tried: list[int] = []

    def trial(n: int) -> Fidelity:
        tried.append(n)
        return _fidelity(0.5 if n <= 44 else 2.0)

    best, result = search_streams(trial)
    assert 40 <= best <= 44 and result is not None  # bisection stops within 1/8 of the answer
    assert tried[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert search_streams(lambda n: _fidelity(5.0)) == (0, None)
    assert search_streams(lambda n: _fidelity(0.1), limit=8)[0] == 8
