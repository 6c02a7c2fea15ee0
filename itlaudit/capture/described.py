"""What a capture tells meta.json about itself: its workers (processes or Ray actors), the ones it
lost, and how its prompts were fitted. These are the JSON forms meta.json keeps (TypedDicts, so the
file's shape is unchanged); the workflows read them through `OnCapture` as the capture goes."""

from __future__ import annotations

from typing import TypedDict


class WorkerWhere(TypedDict):
    """Where a Ray capture actor runs (what its `where` answers)."""

    node: str
    node_ip: str
    hostname: str
    pid: int


class LoopLag(TypedDict):
    """A Ray actor's event-loop lag over its whole run."""

    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    loop_lag_ticks: int


class WorkerDescription(TypedDict, total=False):
    """One capture process or actor: its share, its clock against the coordinator's, and for an
    actor where it ran, its loop lag and why it was lost."""

    worker: int
    pid: int | None  # None only for a process that has not started
    requests: int
    concurrency: int
    clock_offset_ns: int
    clock_rtt_ns: int
    start_ns: int
    node: str
    node_ip: str
    hostname: str
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    loop_lag_ticks: int
    lost: str


class LostWorker(TypedDict):
    """An actor lost mid-run and how many of its requests became worker_lost records."""

    worker: int
    node: str | None
    reason: str | None
    unfinished: int


class RandomChat(TypedDict):
    """meta.json's `random_chat`: enough to relate each record's prompt_tokens to its input_len."""

    input_lens: list[int]
    content_tokens: list[int]
    prompt_tokens: list[int]
    note: str


class CaptureDescription(TypedDict, total=False):
    """The keys a capture adds to its variant's meta.json entry (each `on_capture` call gives some)."""

    cluster: str
    workers: list[WorkerDescription]
    lost_workers: list[LostWorker]
    warmup_workers: list[WorkerDescription]
    warmup_lost_workers: list[LostWorker]
    reply_lengths: str
    random_chat: RandomChat
