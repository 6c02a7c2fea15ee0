"""Metrics on hand-built records with hand-computed answers, plus real vLLM 0.24.0 streams."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from itlaudit.analysis.metrics import (
    SUMMARY_METRICS,
    RequestMetrics,
    median,
    p50,
    per_chunk_itl_ms,
    ratio,
    request_metrics,
    settled_records,
    speedup,
    summarize,
    token_counts,
    tokens_at_chunk_ends,
    tokens_per_chunk_hist,
    variant_summary,
)
from itlaudit.errors import RecordsError
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status
from itlaudit.model.vocabulary import Endpoint
from itlaudit.store.jsonl import load_records

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda"

Row = tuple  # (t_ms, completion_tokens, text_len[, has_choice[, token_ids]])


def series(*rows: Row) -> ChunkSeries:
    out = ChunkSeries()
    for t, count, text_len, *rest in rows:
        has_choice = rest[0] if rest else True
        ids = rest[1] if len(rest) > 1 else None
        out.t_ms.append(float(t))
        out.completion_tokens.append(count)
        out.text_len.append(text_len)
        out.has_choice.append(has_choice)
        out.token_ids.append(ids)
    return out


def record(*rows: Row, **kwargs: object) -> RequestRecord:
    base: dict = {
        "request_id": "r0",
        "variant": "v",
        "endpoint": Endpoint.COMPLETIONS,
        "url": "http://localhost:8000/v1/completions",
        "model": "tiny",
        "params": RequestParams(max_tokens=16),
        "done_sentinel": True,
        "finish_reason": "length",
        "chunks": series(*rows),
    }
    base.update(kwargs)
    return RequestRecord(**base)


K0_ROWS = [(10, 1, 1), (20, 2, 1), (30, 3, 1), (40, 4, 1), (50, 5, 1)]
K3_ROWS = [(10, 1, 1), (50, 5, 4), (90, 9, 4)]


def test_k0_token_and_chunk_itl_agree() -> None:
    m = request_metrics(record(*K0_ROWS, completion_tokens=5, e2e_ms=60.0))
    assert m.ttft_ms == 10.0
    assert m.itl_ms == 10.0
    assert m.chunk_itl_ms == 10.0
    assert m.itl_inflation == 1.0
    assert m.tokens_per_chunk == 1.0
    assert m.decode_tokens_per_chunk == 1.0
    assert m.tpot_ms == pytest.approx((60 - 10) / (5 - 1))
    assert m.e2e_ms == 60.0
    assert m.decode_tokens_per_s == pytest.approx(4 / 40 * 1000)
    assert m.completion_tokens == 5
    assert m.content_chunks == 5
    assert m.token_source == "usage"


def test_k3_chunk_itl_inflated_by_acceptance_length() -> None:
    rec = record(*K3_ROWS, completion_tokens=9, e2e_ms=100.0)
    m = request_metrics(rec)
    assert m.itl_ms == pytest.approx(80 / 8)
    assert m.chunk_itl_ms == pytest.approx(40.0)
    assert m.itl_inflation == pytest.approx(4.0)
    assert m.tokens_per_chunk == pytest.approx(3.0)
    assert m.decode_tokens_per_chunk == pytest.approx(4.0)
    assert m.tpot_ms == pytest.approx((100 - 10) / 8)
    assert m.decode_tokens_per_s == pytest.approx(100.0)
    np.testing.assert_allclose(per_chunk_itl_ms(rec), [10.0, 10.0])
    assert tokens_per_chunk_hist(rec) == {1: 1, 4: 2}


def test_token_counts_returns_content_times_and_cumulative_counts() -> None:
    t, cumulative, source = token_counts(record(*K3_ROWS))
    np.testing.assert_array_equal(t, [10.0, 50.0, 90.0])
    np.testing.assert_array_equal(cumulative, [1, 5, 9])
    assert source == "usage"


def test_chat_role_chunk_and_usage_only_final_chunk_are_not_content() -> None:
    rows = [(2, 0, 0), *K0_ROWS, (51, 5, 0), (52, 5, 0, False)]  # role, content, finish-only, usage-only
    m = request_metrics(record(*rows, completion_tokens=5))
    assert m.content_chunks == 5
    assert m.ttft_ms == 10.0
    assert m.itl_ms == 10.0
    assert m.chunk_itl_ms == 10.0


def test_empty_text_chunk_with_usage_increment_is_a_token() -> None:
    rec = record((10, 1, 1), (20, 2, 0), (30, 3, 1))
    m = request_metrics(rec)
    assert m.content_chunks == 3
    assert m.itl_ms == 10.0
    assert tokens_per_chunk_hist(rec) == {1: 3}


def test_usage_missing_falls_back_to_token_ids() -> None:
    rows = [(10, None, 1, True, [1]), (50, None, 0, True, [2, 3, 4]), (90, None, 5, True, [5, 6, 7, 8])]
    rec = record(*rows)
    _, cumulative, source = token_counts(rec)
    assert source == "token_ids"
    np.testing.assert_array_equal(cumulative, [1, 4, 8])
    m = request_metrics(rec)
    assert m.itl_ms == pytest.approx(80 / 7)
    assert m.chunk_itl_ms == pytest.approx(40.0)
    assert m.completion_tokens == 8  # no usage at all: the last cumulative count stands in
    np.testing.assert_allclose(per_chunk_itl_ms(rec), [40 / 3, 10.0])


def test_usage_missing_without_ids_counts_chunks() -> None:
    # include_usage without continuous stats: only the final usage-only chunk has a count.
    rec = record(*[(t, None, n) for t, _, n in K3_ROWS], (91, 9, 0, False), completion_tokens=9)
    m = request_metrics(rec)
    assert m.token_source == "chunks"
    assert m.itl_ms == pytest.approx(40.0)  # the lie: chunk ITL reported as token ITL
    assert m.itl_inflation == pytest.approx(1.0)
    assert m.completion_tokens == 9  # the server's final total is still the completion length
    assert m.tokens_per_chunk == pytest.approx(1.0)


def test_a_local_tokenizers_counts_stand_in_for_usage_and_ids() -> None:
    """--tokenizer: the tokens that end inside each chunk's text, scaled to the server's final total;
    a chunk that only began a token is no content chunk until one ends in it. (Real: the bundled vLLM
    stream of tests/test_stream_bundled_vllm.py.)"""
    # "ab" "c" "de": tokens "abc" (ends at 3) and "de" (5); the first chunk completes none
    assert tokens_at_chunk_ends([2, 1, 2], [3, 5]) == [0, 1, 2]
    assert tokens_at_chunk_ends([2, 1, 2], [3, 5], total=4) == [0, 2, 4]  # the server said 4 tokens
    rec = record(*[(t, None, n) for t, _, n in K3_ROWS], (91, 9, 0, False), completion_tokens=9)
    rec.chunks.tokenized = [1, 5, 9, 9]
    t, cumulative, source = token_counts(rec)
    assert source == "tokenizer" and cumulative.tolist() == [1, 5, 9] and t.tolist() == [10, 50, 90]
    assert request_metrics(rec).itl_ms == pytest.approx(10.0)  # not the chunk count's 40
    rec.chunks.tokenized = [0, 4, 9, 9]  # the first chunk completed no token: TTFT is the second's
    assert token_counts(rec)[0].tolist() == [50, 90]


def test_settled_records_find_each_series_content_once() -> None:
    """Inside settled_records() a record's content chunks are found once and handed out read-only;
    counts filled in since (the derivation's --tokenizer) are a new finding, and outside the block a
    series changed in place is found afresh."""
    rec = record(*[(t, None, n) for t, _, n in K3_ROWS], (91, 9, 0, False), completion_tokens=9)
    with settled_records():
        first = token_counts(rec)
        assert all(a is b for a, b in zip(first, token_counts(rec), strict=True))
        with pytest.raises(ValueError, match="read-only"):
            first[0][0] = 0.0
        rec.chunks.tokenized = [1, 5, 9, 9]
        assert token_counts(rec)[2] == "tokenizer"
    rec.chunks.tokenized = [0, 4, 9, 9]
    assert token_counts(rec)[0].tolist() == [50, 90]


def test_partial_usage_on_content_chunks_is_not_trusted() -> None:
    rec = record((10, 1, 1), (50, None, 4), (90, 9, 4))
    assert token_counts(rec)[2] == "chunks"


def test_decreasing_usage_never_yields_a_negative_step() -> None:
    rec = record((10, 1, 1), (20, 5, 1), (30, 3, 1), (40, 6, 1))
    _, cumulative, _ = token_counts(rec)
    np.testing.assert_array_equal(cumulative, [1, 5, 6])
    assert (per_chunk_itl_ms(rec) > 0).all()


@pytest.mark.parametrize(
    "rec",
    [
        record(),
        record((2, 0, 0), (3, 0, 0, False)),
        record(status=Status.HTTP_ERROR, http_status=400, error="bad", done_sentinel=False),
    ],
    ids=["no-chunks", "role-and-usage-only", "http-error"],
)
def test_records_without_content_give_none(rec: RequestRecord) -> None:
    m = request_metrics(rec)
    assert m.content_chunks == 0
    for f in fields(RequestMetrics):
        if f.name not in ("content_chunks", "token_source"):
            assert getattr(m, f.name) is None, f.name
    assert per_chunk_itl_ms(rec).size == 0
    assert tokens_per_chunk_hist(rec) == {}


def test_single_chunk_has_ttft_but_no_itl() -> None:
    m = request_metrics(record((10, 4, 4), completion_tokens=4, e2e_ms=40.0))
    assert m.ttft_ms == 10.0
    assert m.tokens_per_chunk == 4.0
    assert m.tpot_ms == pytest.approx(10.0)
    assert (m.itl_ms, m.chunk_itl_ms, m.itl_inflation) == (None, None, None)
    assert (m.decode_tokens_per_chunk, m.decode_tokens_per_s) == (None, None)


def test_single_token_output_has_no_tpot() -> None:
    assert request_metrics(record((10, 1, 1), completion_tokens=1, e2e_ms=12.0)).tpot_ms is None


def test_chunks_in_one_read_have_no_itl() -> None:
    """A decode no clock saw: not 0 ms, which a K sweep ranked the fastest setting (vLLM CPU flushing
    a whole reply in one read at concurrency 2); the quiet side is test_single_chunk's neighbour with
    gaps, every other test here."""
    m = request_metrics(record((10, 1, 1), (10, 2, 1)))
    assert (m.itl_ms, m.chunk_itl_ms) == (None, None)
    assert m.itl_inflation is None
    assert m.decode_tokens_per_s is None


def test_failed_stream_keeps_counts_but_no_latency() -> None:
    m = request_metrics(record(*K3_ROWS, status=Status.STREAM_ERROR, error="boom", completion_tokens=9))
    assert m.content_chunks == 3
    assert m.token_source == "usage"
    assert (m.itl_ms, m.ttft_ms, m.completion_tokens) == (None, None, None)


def test_summarize_drops_none_and_uses_linear_percentiles() -> None:
    s = summarize([1.0, None, 2.0, 3.0, 4.0])
    assert s["count"] == 4
    assert s["mean"] == pytest.approx(2.5)
    assert s["p50"] == pytest.approx(2.5)
    assert s["p90"] == pytest.approx(3.7)
    assert s["p99"] == pytest.approx(3.97)


def test_summarize_with_nothing_defined() -> None:
    assert summarize([None, None]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    assert summarize([])["mean"] is None


def test_variant_summary_covers_every_summary_metric() -> None:
    metrics = [request_metrics(record(*K0_ROWS, completion_tokens=5)), request_metrics(record(*K3_ROWS))]
    out = variant_summary(metrics)
    assert tuple(out) == SUMMARY_METRICS
    assert out["itl_ms"]["mean"] == pytest.approx(10.0)
    assert out["chunk_itl_ms"]["p50"] == pytest.approx(25.0)
    assert out["completion_tokens"]["count"] == 2
    json.dumps(out)


# --- real streams -------------------------------------------------------------------------------


def capture_series(name: str, *, strip_choice_usage: bool = False) -> tuple[ChunkSeries, int | None]:
    """Parse a captured SSE stream by hand: synthetic 10 ms spacing, since captures carry no timing."""
    out = ChunkSeries()
    final_usage = None
    events = (FIXTURES / name).read_text(encoding="utf-8").split("\n\n")
    payloads = [e.strip().removeprefix("data: ") for e in events if e.strip()]
    for i, payload in enumerate(p for p in payloads if p != "[DONE]"):
        obj = json.loads(payload)
        choice = obj["choices"][0] if obj["choices"] else None
        usage = (obj.get("usage") or {}).get("completion_tokens")
        final_usage = usage if usage is not None else final_usage
        if choice is None:
            text = ""
        else:
            text = choice["text"] if "text" in choice else choice["delta"].get("content") or ""
            usage = None if strip_choice_usage else usage
        out.t_ms.append(10.0 * (i + 1))
        out.completion_tokens.append(usage)
        out.text_len.append(len(text))
        out.has_choice.append(choice is not None)
        out.token_ids.append(None if choice is None else choice.get("token_ids"))
    return out, final_usage


def capture_record(name: str, **kwargs: bool) -> RequestRecord:
    chunks, final_usage = capture_series(name, **kwargs)
    return record(chunks=chunks, completion_tokens=final_usage)


def test_real_k3_completions_capture() -> None:
    m = request_metrics(capture_record("completions-k3-token-ids.sse"))
    assert m.completion_tokens == 16
    assert m.content_chunks == 16
    assert m.token_source == "usage"
    assert m.tokens_per_chunk == 1.0
    assert m.itl_ms == pytest.approx(10.0)


def test_real_completions_capture_token_ids_agree_with_usage() -> None:
    with_usage = request_metrics(capture_record("completions-k0-token-ids.sse"))
    ids_only = request_metrics(capture_record("completions-k0-token-ids.sse", strip_choice_usage=True))
    assert ids_only.token_source == "token_ids"
    assert ids_only.itl_ms == with_usage.itl_ms
    assert ids_only.content_chunks == with_usage.content_chunks == 16


def test_real_chat_capture_role_chunk_and_two_token_chunk() -> None:
    rec = capture_record("chat-k0.sse")
    m = request_metrics(rec)
    assert m.token_source == "usage"
    assert m.content_chunks == 15  # role chunk excluded; the last chunk carries tokens 15 and 16
    assert m.completion_tokens == 16
    assert m.ttft_ms == 20.0
    assert tokens_per_chunk_hist(rec) == {1: 14, 2: 1}
    assert m.tokens_per_chunk == pytest.approx(16 / 15)


def test_real_chat_capture_without_usage_undercounts() -> None:
    m = request_metrics(capture_record("chat-k0.sse", strip_choice_usage=True))
    assert m.token_source == "chunks"
    assert m.content_chunks == 12  # three empty-text chunks were real tokens, invisible to chunk counting
    assert m.completion_tokens == 16


def test_ratio_is_none_for_an_unknown_or_non_positive_denominator() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0.0, 2.0) == 0.0
    assert ratio(None, 2.0) is None and ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None and ratio(3.0, -1.0) is None


def test_speedup_follows_the_metric_direction_and_has_no_factor_against_zero() -> None:
    assert speedup(12.0, 4.0, lower_is_better=True) == 3.0
    assert speedup(80.0, 240.0, lower_is_better=False) == 3.0
    assert speedup(0.0, 4.0, lower_is_better=True) is None
    assert speedup(12.0, 0.0, lower_is_better=False) is None


def test_median_and_p50_agree_with_summarize() -> None:
    values = [None, 4.0, 1.0, 2.5, None, 3.0]
    block = {"itl_ms": summarize(values)}
    assert median(values) == p50(block, "itl_ms") == 2.75
    assert median([None]) is None and p50(block, "ttft_ms") is None


def test_a_line_without_token_ids_has_none_for_every_chunk_and_derives() -> None:
    """A requests.jsonl line written without `chunk_token_ids` (a trimmed fixture, an older writer) used
    to reach the metrics as an empty array and fail on numpy broadcasting."""
    line = record(*K3_ROWS, completion_tokens=9, e2e_ms=100.0).to_json()
    del line["chunk_token_ids"]
    loaded = RequestRecord.from_json(json.loads(json.dumps(line)))
    assert loaded.chunks.token_ids == [None, None, None]
    assert request_metrics(loaded).itl_ms == pytest.approx(10.0)


def test_a_line_with_chunk_arrays_of_unequal_length_is_one_records_error(tmp_path: Path) -> None:
    line = record(*K3_ROWS).to_json()
    line["chunk_text_len"] = line["chunk_text_len"][:-1]
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(RecordsError, match="unequal lengths"):
        load_records(path)


def test_each_channel_has_its_own_itl() -> None:
    """A thinking reply: the `<think>` chunk (no text), reasoning chunks every 5 ms, then answer chunks
    every 20 ms; the gaps across a change belong to neither channel, and the answer's tokens
    are completion less the server's reasoning count. The quiet side: a reply that never thought has
    no channels. ~0 s."""
    rows = [(10, 1, 0), (15, 2, 0), (20, 3, 0), (25, 4, 0), (40, 5, 2), (60, 6, 2), (80, 7, 2)]
    thinking = record(*rows, completion_tokens=7, e2e_ms=81.0, reasoning="abcdefg", reasoning_tokens=3)
    thinking.chunks.reasoning_len.extend([0, 2, 2, 3, 0, 0, 0])  # `<think>` first, markup-only
    m = request_metrics(thinking)
    assert (m.reasoning_itl_ms, m.answer_itl_ms) == (5.0, 20.0)
    assert (m.reasoning_tokens, m.answer_tokens) == (3, 4)
    assert m.itl_ms == pytest.approx(70 / 6)  # over every token, as before
    plain = request_metrics(record(*K0_ROWS, completion_tokens=5, e2e_ms=60.0))
    assert (plain.reasoning_itl_ms, plain.answer_itl_ms, plain.answer_tokens) == (None, None, None)
