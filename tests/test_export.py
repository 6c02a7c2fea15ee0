"""chunks.csv: one row per SSE chunk, tokens per chunk by the metrics' own rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from reportkit import stream

from itlaudit.analysis.metrics import request_metrics
from itlaudit.errors import RecordsError
from itlaudit.model.records import RequestRecord
from itlaudit.store.export import CHUNK_COLUMNS, chunks_frame, write_chunks, write_table


def test_one_row_per_chunk_and_tokens_sum_to_the_server_count() -> None:
    records = [
        stream("K3", 0, tokens=16, per_chunk=4, max_tokens=16),
        stream("K0", 0, tokens=8, max_tokens=8),
    ]
    frame = chunks_frame(records)
    assert list(frame.columns) == list(CHUNK_COLUMNS)
    assert len(frame) == sum(len(r.chunks) for r in records)
    k3 = frame[frame.variant == "K3"]
    assert k3.tokens.tolist() == [1, 4, 4, 4, 3, 0]  # last row: the usage-only chunk
    assert k3.tokens.sum() == 16
    assert k3.is_content.tolist() == [True] * 5 + [False]
    decode_gaps = k3.gap_ms.dropna()
    assert decode_gaps.sum() / 15 == pytest.approx(request_metrics(records[0]).itl_ms)


def _with_gaps_in_usage_and_ids() -> RequestRecord:
    """A chat-shaped stream: a role chunk without usage, ids on some chunks, jittered float stamps."""
    record = stream("K0", 1, tokens=6, max_tokens=6, jitter=0.3, seed=7)
    chunks = record.chunks
    chunks.t_ms.insert(0, 12.345678901234567)
    chunks.completion_tokens.insert(0, None)
    chunks.text_len.insert(0, 0)
    chunks.has_choice.insert(0, True)
    chunks.token_ids.insert(0, None)
    chunks.token_ids[1:4] = [[11], [12], [13, 14]]
    return record


def test_csv_round_trip_keeps_every_value(tmp_path: Path) -> None:
    records = [
        stream("K3", 0, tokens=16, per_chunk=4, max_tokens=16, jitter=0.2),
        _with_gaps_in_usage_and_ids(),
    ]
    expected = chunks_frame(records)
    back = pd.read_csv(
        write_chunks(records, tmp_path), dtype={"completion_tokens": "Int64", "n_token_ids": "Int64"}
    )
    pd.testing.assert_frame_equal(back, expected, check_dtype=False, check_exact=True)
    # And the values are the records' own: stamps bit for bit, missing usage and ids as missing.
    chat = back[back.variant == "K0"]
    assert chat.t_ms.tolist() == records[1].chunks.t_ms
    assert chat.completion_tokens.isna().tolist() == [True] + [False] * (len(chat) - 1)
    assert chat.completion_tokens.iloc[1:].tolist() == records[1].chunks.completion_tokens[1:]
    assert chat.n_token_ids.fillna(-1).tolist() == [-1, 1, 1, 2] + [-1] * (len(chat) - 4)
    assert chat.has_choice.tolist() == records[1].chunks.has_choice


def test_unknown_format_and_parquet_without_pyarrow_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RecordsError, match="--format 'xlsx'"):
        write_chunks([], tmp_path, "xlsx")
    # Absent whether or not this machine has them: an import of a None entry raises ImportError.
    for engine in ("pyarrow", "fastparquet"):
        monkeypatch.setitem(sys.modules, engine, None)
    with pytest.raises(RecordsError, match="pyarrow"):
        write_chunks([stream("K0")], tmp_path, "parquet")


def test_empty_run_gives_header_only() -> None:
    assert list(chunks_frame([]).columns) == list(CHUNK_COLUMNS)


def test_csv_is_pandas_to_csv_byte_for_byte(tmp_path: Path) -> None:
    """chunks.csv and requests.csv are written without pandas: the bytes its to_csv writes, whatever
    the columns hold (usage and ids missing on some chunks, ints beside a missing value, booleans
    beside None, text that needs quoting, a key some rows lack)."""
    records = [
        stream("K3", 0, tokens=16, per_chunk=4, max_tokens=16, jitter=0.2),
        _with_gaps_in_usage_and_ids(),
    ]
    chunks = write_chunks(records, tmp_path).read_text(encoding="utf-8")
    assert chunks == chunks_frame(records).to_csv(index=False)
    rows = [
        {"id": "a,b", "n": 1, "status": 200, "ok": True, "x": 0.1, "text": 'say "hi"\nthen go'},
        {"id": "c", "n": 2, "status": None, "ok": None, "x": float("nan"), "text": "plain"},
        {"id": "d", "n": 3, "status": 404, "ok": False, "x": 1e-7, "extra": "only here"},
    ]
    write_table(tmp_path / "t.csv", rows)
    assert (tmp_path / "t.csv").read_text(encoding="utf-8") == pd.DataFrame(rows).to_csv(index=False)
    write_table(tmp_path / "empty.csv", [])
    assert (tmp_path / "empty.csv").read_text(encoding="utf-8") == pd.DataFrame([]).to_csv(index=False)
