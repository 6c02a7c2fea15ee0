"""requests.jsonl on disk: the append-only writer (its own thread: encoding, writing and fsync stay off
the capture loop) and the tolerant reader every later stage loads records with."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.analysis.metrics import TOKEN_SOURCE_CHUNKS, content_chunk_mask, tokens_at_chunk_ends
from itlaudit.errors import RecordsError, ScenarioError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.tokenizer import LocalTokenizer
from itlaudit.store.folder import RunFiles
from itlaudit.store.rundir import TOO_DEEP


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

    def __init__(self, target: Path | int, prepare: Callable[[Any], JSONObject] | None = None) -> None:
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


_NO_LINE: JSONObject = {}  # the writer thread's "nothing came within the fsync interval"


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


_DECODE = msgspec.json.Decoder().decode


def _loads(line: str) -> Any:
    """One line's JSON: msgspec's decoder (10,000 records of 100 chunks: 0.24 s against json's 2.0 s),
    json's where msgspec refuses what json reads (NaN and Infinity, a number past a float's range, a
    lone surrogate escape), so every file reads as it did; what neither reads raises json's error."""
    try:
        return _DECODE(line)
    except msgspec.DecodeError:
        return json.loads(line)


def iter_jsonl(path: Path) -> Iterator[JSONObject]:
    """Yield JSON objects from a JSONL file; a truncated last line (crash mid-write) is skipped."""
    if not path.is_file():
        raise RecordsError(f"{path}: no such file; point at a run folder that contains requests.jsonl")
    with path.open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield _loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                return  # partial final line from an interrupted write
            raise RecordsError(f"{path}:{lineno}: not valid JSON ({exc.msg}); the file is damaged") from None
        except RecursionError:
            raise RecordsError(f"{path}:{lineno}: {TOO_DEEP}") from None


@dataclass(frozen=True)
class RecordFile:
    """A requests.jsonl as read: its measured records, and how many whole lines (records, warmup ones
    included) it held, which summary.json repeats so a reader can check the one against the other."""

    records: list[RequestRecord]
    lines: int
    warmup: int


def read_records(path: Path) -> RecordFile:
    """Load raw records from a requests.jsonl; derived keys on each line are ignored.

    Warmup requests stay in requests.jsonl but are dropped here: this is the one door every
    figure, count, finding and report goes through, so excluding them here excludes them everywhere.
    Records of a format this itlaudit does not read (meta.json says which) are refused first."""
    meta = RunFiles(path.parent).meta_as_context
    out = []
    lines = 0
    for obj in iter_jsonl(path):
        try:
            record = RequestRecord.from_json(obj)
        except (TypeError, ValueError) as exc:  # wrong keys, or a status Status does not know
            raise RecordsError(f"{path}: a line is not an itlaudit request record ({exc})") from None
        lines += 1
        if not record.warmup:
            out.append(record)
    if meta.tokenizer is not None:
        count_tokens_locally(out, Path(meta.tokenizer))
    return RecordFile(records=out, lines=lines, warmup=lines - len(out))


def count_tokens_locally(records: Sequence[RequestRecord], tokenizer: Path) -> None:
    """Each record whose stream counts its tokens nowhere (neither usage nor ids per chunk) gets its
    chunks' token counts from the run's --tokenizer (ChunkSeries.tokenized, never written back). The
    tokenizer is loaded only when such a record is there; one that is gone (the folder was copied to
    a machine without it) leaves them counted by chunks, as the findings then say."""
    uncounted = [r for r in records if content_chunk_mask(r.chunks)[2] == TOKEN_SOURCE_CHUNKS]
    if not uncounted:
        return
    try:
        local = LocalTokenizer(tokenizer)
    except ScenarioError:
        return
    for record in uncounted:
        ends = local.token_ends(record.text)
        record.chunks.tokenized = tokens_at_chunk_ends(record.chunks.text_len, ends, record.completion_tokens)


def load_records(path: Path) -> list[RequestRecord]:
    """The measured records of a requests.jsonl (read_records without the counts)."""
    return read_records(path).records
