"""chunks.csv: one row per SSE chunk, tokens per chunk by the metrics' own rule."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from reportkit import stream

from itlaudit.analysis.metrics import request_metrics
from itlaudit.errors import RecordsError
from itlaudit.store.export import CHUNK_COLUMNS, chunks_frame, write_chunks


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


def test_csv_round_trips_and_parquet_without_pyarrow_is_a_clear_error(tmp_path: Path) -> None:
    path = write_chunks([stream("K0")], tmp_path)
    assert len(pd.read_csv(path)) == len(stream("K0").chunks)
    with pytest.raises(RecordsError, match="--format 'xlsx'"):
        write_chunks([], tmp_path, "xlsx")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(RecordsError, match="pyarrow"):
            write_chunks([stream("K0")], tmp_path, "parquet")


def test_empty_run_gives_header_only() -> None:
    assert list(chunks_frame([]).columns) == list(CHUNK_COLUMNS)
