"""chunks.csv / chunks.parquet: one row per SSE chunk, for people who want the raw timing in pandas.

requests.jsonl keeps chunks as parallel arrays per request (compact, append-only); a notebook wants
long format. Each row carries the raw fields as received plus, for content chunks, the tokens that
chunk delivered by the same rule the metrics use, so a notebook's numbers match the report's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from itlaudit.analysis.metrics import content_chunk_mask
from itlaudit.errors import RecordsError
from itlaudit.model.records import RequestRecord

__all__ = ["CHUNK_COLUMNS", "CHUNK_FORMATS", "chunks_frame", "write_chunks"]

CHUNK_FORMATS = ("csv", "parquet")
CHUNK_COLUMNS = (
    "variant",
    "request_id",
    "chunk_index",
    "t_ms",
    "gap_ms",
    "completion_tokens",
    "is_content",
    "tokens",
    "token_source",
    "has_choice",
    "text_len",
    "n_token_ids",
)


def chunks_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """`gap_ms` is the time since the previous content chunk (NaN on the first); `tokens` is what the
    content chunk carried (0 for role/finish/usage-only chunks); `completion_tokens` is the server's
    cumulative usage count, as sent (NaN when the chunk had none)."""
    import pandas as pd  # seconds to import: keep it off the CLI's start-up path

    # Columns are gathered as arrays over all records and the frame built once: a frame per request
    # (then pd.concat) cost ~1 s at 1024 requests, most of a run's fixed overhead past the capture.
    columns: dict[str, list[np.ndarray]] = {name: [] for name in CHUNK_COLUMNS}
    for record in records:
        chunks = record.chunks
        n = len(chunks)
        if n == 0:
            continue
        mask, cumulative, source = content_chunk_mask(chunks)
        t = np.asarray(chunks.t_ms, dtype=float)
        tokens = np.zeros(n, dtype=np.int64)
        tokens[mask] = np.diff(cumulative, prepend=0)
        gap = np.full(n, np.nan)
        gap[np.flatnonzero(mask)[1:]] = np.diff(t[mask])
        row = {
            "variant": np.full(n, record.variant, dtype=object),
            "request_id": np.full(n, record.request_id, dtype=object),
            "chunk_index": np.arange(n),
            "t_ms": t,
            "gap_ms": gap,
            "completion_tokens": np.array(chunks.completion_tokens, dtype=object),
            "is_content": mask,
            "tokens": tokens,
            "token_source": np.full(n, source, dtype=object),
            "has_choice": np.asarray(chunks.has_choice, dtype=bool),
            "text_len": np.asarray(chunks.text_len, dtype=np.int64),
            "n_token_ids": np.array(
                [None if ids is None else len(ids) for ids in chunks.token_ids], dtype=object
            ),
        }
        for name in CHUNK_COLUMNS:
            columns[name].append(row[name])
    if not columns["variant"]:
        return pd.DataFrame(columns=list(CHUNK_COLUMNS))
    nullable = ("completion_tokens", "n_token_ids")  # None where absent: nullable integers
    return pd.DataFrame(
        {
            name: pd.array(np.concatenate(parts), dtype="Int64")
            if name in nullable
            else np.concatenate(parts)
            for name, parts in columns.items()
        }
    )


def write_chunks(records: Sequence[RequestRecord], out_dir: Path, fmt: str = "csv") -> Path:
    """Parquet needs pyarrow (not a dependency: most users only want the CSV); say so, don't crash."""
    if fmt not in CHUNK_FORMATS:
        raise RecordsError(f"--format {fmt!r}: expected one of {', '.join(CHUNK_FORMATS)}")
    frame = chunks_frame(records)
    path = out_dir / f"chunks.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
        return path
    try:
        frame.to_parquet(path, index=False)
    except ImportError:
        raise RecordsError("chunks.parquet needs pyarrow: pip install pyarrow, or use --format csv") from None
    return path
