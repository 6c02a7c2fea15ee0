"""chunks.csv / chunks.parquet: one row per SSE chunk, for people who want the raw timing in pandas.

requests.jsonl keeps chunks as parallel arrays per request (compact, append-only); a notebook wants
long format. Each row carries the raw fields as received plus, for content chunks, the tokens that
chunk delivered by the same rule the metrics use, so a notebook's numbers match the report's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from itlaudit.analysis.metrics import content_chunk_mask
from itlaudit.errors import RecordsError
from itlaudit.model.records import RequestRecord

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


def _steps(record: RequestRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """A record's per-chunk figures: stamps, the content mask, the tokens each chunk carried (0 off
    content) and the gap since the previous content chunk (NaN on the first and off content)."""
    chunks = record.chunks
    mask, cumulative, source = content_chunk_mask(chunks)
    t = np.asarray(chunks.t_ms, dtype=float)
    tokens = np.zeros(len(chunks), dtype=np.int64)
    tokens[mask] = np.diff(cumulative, prepend=0)
    gap = np.full(len(chunks), np.nan)
    gap[np.flatnonzero(mask)[1:]] = np.diff(t[mask])
    return t, mask, tokens, gap, source


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
        t, mask, tokens, gap, source = _steps(record)
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


_QUOTED = re.compile('[,"\r\n]')


def _cell(text: str) -> str:
    """A text cell as the csv module's QUOTE_MINIMAL (pandas' to_csv) writes it."""
    return '"' + text.replace('"', '""') + '"' if _QUOTED.search(text) else text


def _csv_rows(record: RequestRecord) -> str:
    """A record's rows of chunks.csv, each cell as pandas' to_csv writes the frame's: floats
    shortest-exact (repr), NaN and None empty, booleans True/False. A row is one join of its cells."""
    chunks = record.chunks
    n = len(chunks)
    if n == 0:
        return ""
    t, mask, tokens, gap, source = _steps(record)
    gaps = list(map(repr, gap.tolist()))
    for i in np.flatnonzero(np.isnan(gap)).tolist():
        gaps[i] = ""
    cells = zip(
        repeat(f"{_cell(record.variant)},{_cell(record.request_id)}", n),
        map(str, range(n)),
        map(repr, t.tolist()),
        gaps,
        ["" if c is None else str(c) for c in chunks.completion_tokens],
        map(str, mask.tolist()),
        map(str, tokens.tolist()),
        repeat(_cell(source), n),
        map(str, np.asarray(chunks.has_choice, dtype=bool).tolist()),
        map(str, chunks.text_len),
        ["" if ids is None else str(len(ids)) for ids in chunks.token_ids],
        strict=True,
    )
    return "\n".join(map(",".join, cells)) + "\n"


def write_chunks(records: Sequence[RequestRecord], out_dir: Path, fmt: str = "csv") -> Path:
    """Parquet needs pyarrow (not a dependency: most users only want the CSV); say so, don't crash.
    The CSV is written without pandas, record by record (pandas' import and to_csv were 6 s of a
    1024 x 500 run's finish on a 2-core box): the same bytes as the frame's to_csv."""
    if fmt not in CHUNK_FORMATS:
        raise RecordsError(f"--format {fmt!r}: expected one of {', '.join(CHUNK_FORMATS)}")
    path = out_dir / f"chunks.{fmt}"
    if fmt == "csv":
        with path.open("w", encoding="utf-8", newline="") as fh:
            fh.write(",".join(CHUNK_COLUMNS) + "\n")
            fh.writelines(map(_csv_rows, records))
        return path
    try:
        chunks_frame(records).to_parquet(path, index=False)
    except ImportError:
        raise RecordsError("chunks.parquet needs pyarrow: pip install pyarrow, or use --format csv") from None
    return path


def _column_cells(values: list[Any]) -> list[str]:
    """A column's cells as pandas writes the column it infers from these values: booleans (None
    among them: an object column) as True/False; numbers as float64 (repr) once one is a float or
    missing, an int column's otherwise; anything else as str(); missing values empty."""
    present = [v for v in values if v is not None and v == v]  # v == v: not NaN
    kinds = set(map(type, present))
    if kinds and kinds <= {int, float} and (len(present) < len(values) or float in kinds):
        return ["" if v is None or v != v else repr(float(v)) for v in values]
    if kinds == {str}:
        return ["" if v is None else _cell(v) for v in values]
    return ["" if v is None or v != v else _cell(str(v)) for v in values]


def write_table(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """A CSV of scalar rows as `pd.DataFrame(rows).to_csv(path, index=False)` writes it, byte for byte,
    without pandas (a third of a second to import, on every run's finish): columns in the order keys
    first appear, a key a row lacks an empty cell."""
    names = list(dict.fromkeys(key for row in rows for key in row))
    columns = [_column_cells([row.get(name) for row in rows]) for name in names]
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write(",".join(map(_cell, names)) + "\n")
        fh.writelines(",".join(cells) + "\n" for cells in zip(*columns, strict=True))
