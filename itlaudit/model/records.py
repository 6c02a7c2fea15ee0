"""Raw per-request records: the one artefact every later stage (metrics, findings, report) reads.

A record holds only what was observed on the wire plus the request parameters needed to judge it;
derived figures live in `metrics`/`findings` and are recomputable from a saved requests.jsonl.
Chunk lists are parallel arrays (one entry per SSE data event carrying JSON) so metrics can work on
numpy arrays directly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.vocabulary import Endpoint, StampMode


class Status(StrEnum):
    """A request's outcome as the client saw it (not a judgement of the output). A StrEnum, so
    requests.jsonl keeps the plain strings."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    STREAM_ERROR = "stream_error"  # server sent data: {"error": ...}
    CONNECTION_ERROR = "connection_error"  # connection reset / refused / dropped mid-request
    TIMEOUT = "timeout"  # cut by one of the workload's timeouts (`timeout_limit` says which)
    RATE_LIMITED = "rate_limited"  # HTTP 429 or 503: the server asked to come back later
    WORKER_LOST = "worker_lost"  # its capture worker (a Ray actor) died before reporting it


# The timeout_limit of a stream cut because the run's duration_s and its grace were over.
DURATION_CUT = "duration_cut_s"


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

    `duration_cut_s` is not a [workload] key but the end of a duration_s run: duration_s plus its
    grace, counted from `start_s` (the measured phase's start, monotonic seconds on the capturing
    process's clock, set by the worker when it knows it); a stream still open then is cut, whenever it
    began.
    """

    connect_timeout_s: float | None = 30.0
    ttft_timeout_s: float | None = None
    stall_timeout_s: float | None = 60.0
    request_timeout_s: float | None = None
    duration_cut_s: float | None = None
    start_s: float | None = None

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
        if self.duration_cut_s is not None and self.start_s is not None:
            left_s = self.duration_cut_s - (now_ns / 1e9 - self.start_s)
            if wait_s is None or left_s < wait_s:
                wait_s, limit = left_s, DURATION_CUT
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
    # Characters of the reasoning channel each chunk carried (chat's delta.reasoning or
    # reasoning_content): 0 for an answer chunk. Empty for a stream that never thought (the capture
    # loop starts it at the first reasoning chunk, so other streams pay nothing), and written only
    # for a record that thought (see to_json).
    reasoning_len: list[int] = field(default_factory=list)
    # Derived, never written: the tokens a local tokenizer (--tokenizer) finds complete in the text up
    # to the end of each chunk, for a stream that says neither usage nor ids per chunk. Filled by the
    # derivation (workflows.derive) from requests.jsonl's text, so the raw record stays what was sent.
    tokenized: list[int] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.t_ms)


@dataclass
class RequestRecord:
    """Everything observed for one streamed request."""

    request_id: str
    variant: str
    endpoint: Endpoint
    url: str
    model: str
    params: RequestParams
    status: Status = Status.OK
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
    text: str = ""  # the answer: completions' text, chat's delta.content
    # chat's reasoning channel, apart from the answer (a thinking model behind a reasoning parser)
    reasoning: str = ""
    # usage.completion_tokens_details.reasoning_tokens, where the server counts them
    reasoning_tokens: int | None = None
    chunks: ChunkSeries = field(default_factory=ChunkSeries)
    started_at_unix: float | None = None  # wall clock, for provenance only: never used in timing
    # The capturing worker's event-loop lag while this stream was open (a 1 ms ticker's lateness): what
    # the stamps may be off by because the client, not the server, was busy.
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    worker: int = 0  # which capture process; its clock offset is in meta.json
    stamp: StampMode | None = None  # how chunk times were taken: socket receive time, or the loop's
    timeout_limit: str | None = (
        None  # connect_timeout_s / ttft_timeout_s / stall_timeout_s / request_timeout_s / duration_cut_s
    )
    retry_after_s: float | None = None  # a 429/503's Retry-After, in seconds
    invalid_utf8_chunks: int = 0  # data events that were not valid UTF-8 (decoded with U+FFFD)
    other_index_chunks: int = 0  # chunks whose choices[].index was not 0: a server answering n > 1 anyway
    sent_monotonic_ns: int | None = None  # t0 on the worker's monotonic clock (meta.json has its offset)
    # Open loop: when the schedule had the request due, and when it was really dispatched, both in ms
    # from the variant's shared start (the dispatch offset is kept in a closed loop too).
    scheduled_ms: float | None = None
    sent_offset_ms: float | None = None
    warmup: bool = False  # a [workload] warmup request: kept here, left out of every figure and count
    category: str | None = None  # the dataset line's category, for the per-category breakdown
    # The server's own acceptance for this request: vLLM's `metrics.speculative_decoding` on the final
    # usage chunk (--per-request-spec-decode-metrics), as sent; None when the server sent none.
    spec_decode: JSONObject | None = None
    # The prompt's length in tokens as sent, where the client knows it (a token-id prompt): what the
    # server's usage.prompt_tokens must match (prompt_tokens_mismatch); None for a text prompt.
    sent_prompt_tokens: int | None = None
    # Capture-side only, never written: the lag probe's sample positions while the stream was open.
    lag_window: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    @property
    def output(self) -> str:
        """Everything the model wrote, thinking first: what the text audits read (a broken decode
        path garbles the reasoning channel as much as the answer)."""
        return self.reasoning + self.text

    def to_json(self) -> JSONObject:
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
        if self.reasoning:  # a stream without thinking writes no array of zeros
            data["chunk_reasoning_len"] = chunks.reasoning_len
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of to_json; derived keys (itl_ms, findings, ...) on the line are ignored."""
        known = {f.name for f in _RECORD_FIELDS}
        # The constructor's keyword arguments, each checked by the field it fills (a bad one raises).
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        kwargs["params"] = RequestParams(**data.get("params", {}))
        if "status" in kwargs:
            kwargs["status"] = Status(kwargs["status"])
        if kwargs.get("stamp") is not None:
            kwargs["stamp"] = StampMode(kwargs["stamp"])
        if "endpoint" in kwargs:
            kwargs["endpoint"] = Endpoint(kwargs["endpoint"])
        t_ms = list(data.get("chunk_t_ms", []))
        # Counts and ids are what a server may not send: a line written without them (an older
        # itlaudit, a trimmed fixture, an importer) has none for any chunk, not an empty array.
        absent: list[Any] = [None] * len(t_ms)
        chunks = ChunkSeries(
            t_ms=t_ms,
            completion_tokens=list(data.get("chunk_tokens", absent)),
            text_len=list(data.get("chunk_text_len", [])),
            has_choice=list(data.get("chunk_has_choice", [])),
            token_ids=list(data.get("chunk_token_ids", absent)),
            reasoning_len=list(data.get("chunk_reasoning_len", [0] * len(t_ms))),
        )
        lengths = {len(getattr(chunks, f.name)) for f in fields(ChunkSeries) if f.name != "tokenized"}
        if len(lengths) > 1:
            raise ValueError(f"chunk arrays of unequal lengths {sorted(lengths)}: the line is damaged")
        kwargs["chunks"] = chunks
        return cls(**kwargs)


_RECORD_FIELDS = [f for f in fields(RequestRecord) if f.name not in ("params", "chunks", "lag_window")]
