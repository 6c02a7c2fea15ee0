"""Raw per-request records: the one artefact every later stage (metrics, findings, report) reads.

A record holds only what was observed on the wire plus the request parameters needed to judge it;
derived figures live in `metrics`/`findings` and are recomputable from a saved requests.jsonl.
Chunk lists are parallel arrays (one entry per SSE data event carrying JSON) so metrics can work on
numpy arrays directly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.errors import RecordsError

# Request outcome, as seen by the client (not a judgement of the output).
STATUS_OK = "ok"
STATUS_HTTP_ERROR = "http_error"
STATUS_STREAM_ERROR = "stream_error"  # server sent data: {"error": ...}
STATUS_CONNECTION_ERROR = "connection_error"  # connection reset / refused / dropped mid-request
STATUS_TIMEOUT = "timeout"  # cut by one of the workload's timeouts (`timeout_limit` says which)
STATUS_RATE_LIMITED = "rate_limited"  # HTTP 429 or 503: the server asked to come back later


@dataclass
class RequestParams:
    """The sampling/limit parameters that findings judge the output against."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    temperature: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Timeouts:
    """The workload's limits on one request ([workload] keys of the same names, CLI overrides).

    `stall_timeout_s` is the longest silence allowed between reads, from the response head on, so a
    server that goes quiet after its headers is cut too; `ttft_timeout_s`, when set, replaces it
    until the first chunk (long queues at high concurrency); `request_timeout_s` bounds the whole
    request. None means no limit.
    """

    connect_timeout_s: float | None = 30.0
    ttft_timeout_s: float | None = None
    stall_timeout_s: float | None = 60.0
    request_timeout_s: float | None = None

    def limit(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    def next_wait(self, t0_ns: int, now_ns: int, started: bool) -> tuple[float | None, str]:
        """How long the next read may wait, and which limit that is."""
        elapsed_s = (now_ns - t0_ns) / 1e9
        wait_s: float | None
        if started or self.ttft_timeout_s is None:
            wait_s, limit = self.stall_timeout_s, "stall_timeout_s"
        else:
            wait_s, limit = self.ttft_timeout_s - elapsed_s, "ttft_timeout_s"
        if self.request_timeout_s is not None:
            left_s = self.request_timeout_s - elapsed_s
            if wait_s is None or left_s < wait_s:
                wait_s, limit = left_s, "request_timeout_s"
        return wait_s, limit


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
    # The capturing worker's event-loop lag while this stream was open (a 1 ms ticker's lateness): what
    # the stamps may be off by because the client, not the server, was busy.
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    worker: int = 0  # which capture process; its clock offset is in meta.json
    stamp: str | None = None  # how chunk times were taken: "kernel" (socket receive time) or "loop"
    timeout_limit: str | None = (
        None  # connect_timeout_s / ttft_timeout_s / stall_timeout_s / request_timeout_s
    )
    retry_after_s: float | None = None  # a 429/503's Retry-After, in seconds
    invalid_utf8_chunks: int = 0  # data events that were not valid UTF-8 (decoded with U+FFFD)
    sent_monotonic_ns: int | None = None  # t0 on the worker's monotonic clock (meta.json has its offset)
    # Open loop: when the schedule had the request due, and when it was really dispatched, both in ms
    # from the variant's shared start (the dispatch offset is kept in a closed loop too).
    scheduled_ms: float | None = None
    sent_offset_ms: float | None = None
    warmup: bool = False  # a [workload] warmup request: kept here, left out of every figure and count
    category: str | None = None  # the dataset line's category, for the per-category breakdown
    # Capture-side only, never written: the lag probe's sample positions while the stream was open.
    lag_window: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Flat JSON: chunk arrays become top-level `chunk_*` keys (the requests.jsonl layout).
        Shallow (lists are shared, not copied): building it costs microseconds on the capture loop."""
        data = {f.name: getattr(self, f.name) for f in _RECORD_FIELDS}
        data["params"] = asdict(self.params)
        chunks = self.chunks
        data["chunk_t_ms"] = chunks.t_ms
        data["chunk_tokens"] = chunks.completion_tokens
        data["chunk_text_len"] = chunks.text_len
        data["chunk_has_choice"] = chunks.has_choice
        data["chunk_token_ids"] = chunks.token_ids
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of to_json; derived keys (itl_ms, findings, ...) on the line are ignored."""
        known = {f.name for f in _RECORD_FIELDS}
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


_RECORD_FIELDS = [f for f in fields(RequestRecord) if f.name not in ("params", "chunks", "lag_window")]


class RecordWriter:
    """Append-only JSONL writer whose encoding, writing and fsync happen on its own thread, so the
    event loop that timestamps chunks only hands a line over (a queue put) when a request ends.

    A line is written to the OS as soon as the thread takes it (microseconds after the request ends,
    so a SIGKILL loses at most the requests that finished in that instant); fsync follows at most every
    `FSYNC_INTERVAL_S` and at close, so a machine crash loses at most that much more. A failed write
    (disk full, read-only file system) cuts the file back to its last complete line, stops the writer
    and is raised as one `RecordsError` by the next `write` or by `close`: the records so far stay
    intact and no half line is left for a later append to glue onto.
    """

    FSYNC_INTERVAL_S = 1.0

    def __init__(self, target: Path | int, prepare: Callable[[Any], dict[str, Any]] | None = None) -> None:
        """`target` is a file to append to, or an open descriptor (a worker's pipe to the coordinator).
        `prepare`, when given, turns each handed-over item into its line on the writer thread."""
        self.path = target if isinstance(target, Path) else Path(f"<fd {target}>")
        if isinstance(target, Path):
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                raise _write_failure(self.path, exc) from None
            self._owns_fd = True
        else:
            self._fd, self._owns_fd = target, False
        self._prepare = prepare
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failure: RecordsError | None = None
        self._thread = threading.Thread(target=self._drain, name=f"records:{self.path.name}", daemon=True)
        self._thread.start()

    def write(self, line: Any) -> None:
        """Hand a line (a dict, already-encoded bytes, or what `prepare` takes) to the writer thread;
        it must not be changed afterwards."""
        if self._failure is not None:
            raise self._failure
        self._queue.put(line)

    def check(self) -> None:
        """Raise the writer's failure, if any: a run stops at the first one instead of measuring
        requests it can no longer keep."""
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._owns_fd and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self.check()

    def _drain(self) -> None:
        encode = msgspec.json.Encoder().encode
        last_sync = time.monotonic()
        dirty = False
        while True:
            try:
                line = self._queue.get(timeout=self.FSYNC_INTERVAL_S) if dirty else self._queue.get()
            except queue.Empty:
                line = _NO_LINE
            if line is None:
                break
            try:
                if line is not _NO_LINE:
                    if self._prepare is not None:
                        line = self._prepare(line)
                    _write_all(self._fd, (line if isinstance(line, bytes) else encode(line)) + b"\n")
                    dirty = True
                if dirty and time.monotonic() - last_sync >= self.FSYNC_INTERVAL_S:
                    _fsync(self._fd)
                    dirty, last_sync = False, time.monotonic()
            except OSError as exc:
                self._failure = _write_failure(self.path, exc)
                return
        if dirty:
            with contextlib.suppress(OSError):
                _fsync(self._fd)

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_NO_LINE: dict[str, Any] = {}  # the writer thread's "nothing came within the fsync interval"


def _write_all(fd: int, data: bytes) -> None:
    """One line, all or nothing: after a short or failed write the file is cut back to where the line
    began, so what is on disk is always whole lines."""
    try:
        start: int | None = os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        start = None  # a pipe: the coordinator on the other end keeps only whole lines
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError:
        if start is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
        raise


def _fsync(fd: int) -> None:
    """Some file systems (pipes, a few FUSE mounts) cannot fsync; that is not a failure to write."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise


def _write_failure(path: Path, exc: OSError) -> RecordsError:
    reason = exc.strerror or str(exc)
    return RecordsError(
        f"cannot write {path}: {reason}; the records written so far are intact — free space or choose "
        "a writable --out"
    )


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
    """Load raw records from a requests.jsonl; derived keys on each line are ignored.

    Warmup requests stay in requests.jsonl but are dropped here: this is the one door every
    figure, count, finding and report goes through, so excluding them here excludes them everywhere."""
    out = []
    for obj in iter_jsonl(path):
        try:
            record = RequestRecord.from_json(obj)
        except TypeError as exc:
            raise RecordsError(f"{path}: a line is not an itlaudit request record ({exc})") from None
        if not record.warmup:
            out.append(record)
    return out
