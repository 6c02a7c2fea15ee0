"""Raw per-request records: the one artefact every later stage (metrics, findings, report) reads.

A record holds only what was observed on the wire plus the request parameters needed to judge it;
derived figures live in `metrics`/`findings` and are recomputable from a saved requests.jsonl.
Chunk lists are parallel arrays (one entry per SSE data event carrying JSON) so metrics can work on
numpy arrays directly.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from itlaudit.errors import RecordsError

# Request outcome, as seen by the client (not a judgement of the output).
STATUS_OK = "ok"
STATUS_HTTP_ERROR = "http_error"
STATUS_STREAM_ERROR = "stream_error"  # server sent data: {"error": ...}
STATUS_CONNECTION_ERROR = "connection_error"  # connection reset / refused / timeout mid-request


@dataclass
class RequestParams:
    """The sampling/limit parameters that findings judge the output against."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    temperature: float | None = None
    seed: int | None = None


@dataclass
class ChunkSeries:
    """One entry per SSE `data:` JSON event, in arrival order.

    `t_ms` is taken from a monotonic clock at receipt, relative to the moment the request was sent.
    `completion_tokens` is the server's cumulative usage count (None when the chunk had no usage).
    `has_choice` is False for the final usage-only chunk (choices == []).
    `token_ids` is None when the server did not return ids for that chunk.
    """

    t_ms: list[float] = field(default_factory=list)
    completion_tokens: list[int | None] = field(default_factory=list)
    text_len: list[int] = field(default_factory=list)
    has_choice: list[bool] = field(default_factory=list)
    token_ids: list[list[int] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t_ms)


@dataclass
class RequestRecord:
    """Everything observed for one streamed request."""

    request_id: str
    variant: str
    endpoint: str
    url: str
    model: str
    params: RequestParams
    status: str = STATUS_OK
    http_status: int | None = None
    error: str | None = None  # HTTP error body message, error frame message, or connection error
    response_id: str | None = None
    system_fingerprint: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the final usage, else the last seen usage
    done_sentinel: bool = False
    e2e_ms: float | None = None  # send → end of stream ([DONE] or close)
    text: str = ""
    chunks: ChunkSeries = field(default_factory=ChunkSeries)
    started_at_unix: float | None = None  # wall clock, for provenance only: never used in timing
    # Time the client spent parsing chunks (receipt → record appended), summed: when this is a large
    # share of e2e_ms the client, not the server, may be what is being measured.
    client_overhead_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Flat JSON: chunk arrays become top-level `chunk_*` keys (the requests.jsonl layout)."""
        data = asdict(self)
        chunks = data.pop("chunks")
        data["chunk_t_ms"] = chunks["t_ms"]
        data["chunk_tokens"] = chunks["completion_tokens"]
        data["chunk_text_len"] = chunks["text_len"]
        data["chunk_has_choice"] = chunks["has_choice"]
        data["chunk_token_ids"] = chunks["token_ids"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of to_json; derived keys (itl_ms, findings, ...) on the line are ignored."""
        known = {f.name for f in fields(cls)} - {"params", "chunks"}
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        kwargs["params"] = RequestParams(**data.get("params", {}))
        kwargs["chunks"] = ChunkSeries(
            t_ms=list(data.get("chunk_t_ms", [])),
            completion_tokens=list(data.get("chunk_tokens", [])),
            text_len=list(data.get("chunk_text_len", [])),
            has_choice=list(data.get("chunk_has_choice", [])),
            token_ids=list(data.get("chunk_token_ids", [])),
        )
        return cls(**kwargs)


class RecordWriter:
    """Append-only JSONL writer: each line is flushed and fsynced before the next request can start,
    so a crash never loses a finished request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        self._fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._fh.flush()
        with contextlib.suppress(OSError):
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield JSON objects from a JSONL file; a truncated last line (crash mid-write) is skipped."""
    if not path.is_file():
        raise RecordsError(f"{path}: no such file; point at a run folder that contains requests.jsonl")
    with path.open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                return  # partial final line from an interrupted write
            raise RecordsError(f"{path}:{lineno}: not valid JSON ({exc.msg}); the file is damaged") from None


def load_records(path: Path) -> list[RequestRecord]:
    """Load raw records from a requests.jsonl; derived keys on each line are ignored."""
    out = []
    for obj in iter_jsonl(path):
        try:
            out.append(RequestRecord.from_json(obj))
        except TypeError as exc:
            raise RecordsError(f"{path}: a line is not an itlaudit request record ({exc})") from None
    return out
