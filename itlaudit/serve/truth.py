"""The ground-truth SSE server: it knows when it sent every chunk, so a client's stamps can be graded.

It speaks vLLM's /v1/completions streaming wire format with the simulator's own frame builders (request
validation, chunk layout, usage, [DONE]) but none of its engine: every response's frames are encoded
before its first chunk is due, and ONE timer drives all open streams on a shared grid of absolute
times (tick n is due at n / chunks_per_s on CLOCK_MONOTONIC), as one vLLM engine step feeds every
running request at once. Each chunk's send time is `time.monotonic_ns()` taken right after its
`transport.write` returned, which on loopback means the bytes are in the client's socket buffer (a
write that had to be buffered in user space is counted, so the log says when that was not so).

A raw asyncio protocol rather than aiohttp.web: the timer writes straight to each transport, with no
per-chunk coroutine, awaited drain or chunked-encoding writer between the schedule and the socket.
The loop's own timer wakes up to 1 ms late (epoll has millisecond resolution), so the timer is armed
early and the last stretch is slept precisely; the intended (due) time of each chunk is logged beside
its actual send time, so the server's own lag is part of the record.

Run it in its own process (`python -m itlaudit.serve.truth --port N ...`): sharing an event loop with
the client under test would make the client's stalls the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from itlaudit.model.sendlog import SendLog
from itlaudit.serve.sim.config import SimConfig
from itlaudit.serve.sim.engine import Job
from itlaudit.serve.truth_frames import ScheduledStream, Template, build_template
from itlaudit.serve.truth_http import Connection

__all__ = ["TruthConfig", "TruthServer", "main", "raise_priority", "serve_truth"]

# How long before a tick the loop's timer is armed; the rest is slept with nanosleep's precision.
_EARLY_WAKE_NS = 1_200_000
_REALTIME_PRIORITY = 10


@dataclass(frozen=True)
class TruthConfig:
    """The load the server imposes: every stream gets one chunk of `tokens_per_chunk` tokens per tick."""

    chunks_per_s: float = 500.0
    tokens_per_chunk: int = 1
    ttft_ms: float = 20.0  # as the simulator: headers go out first, the first chunk after "prefill"
    model: str = "truth"
    max_model_len: int = 1 << 20

    def __post_init__(self) -> None:
        if self.chunks_per_s <= 0 or self.tokens_per_chunk < 1 or self.ttft_ms < 0:
            raise ValueError("chunks_per_s > 0, tokens_per_chunk >= 1 and ttft_ms >= 0 are required")

    @property
    def period_ns(self) -> int:
        return round(1e9 / self.chunks_per_s)

    def sim_config(self) -> SimConfig:
        """The simulator settings whose validation and frame layout the truth server borrows."""
        return SimConfig(model=self.model, max_model_len=self.max_model_len)


class TruthServer:
    """Owns the streams, the one timer and the send log."""

    def __init__(self, config: TruthConfig) -> None:
        self.config = config
        self.sim = config.sim_config()
        self.log = SendLog(server={"kind": "truth", **asdict(config)})
        self.buffered_writes = self.closed_early = 0
        self.streams: list[ScheduledStream] = []
        self.templates: dict[tuple[Any, ...], Template] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick_due_ns = 0

    # -- the timer -------------------------------------------------------------------------------------

    def start_stream(self, stream: ScheduledStream) -> None:
        self.streams.append(stream)
        if self._timer is None or stream.first_due_ns < self._tick_due_ns:
            self._arm(stream.first_due_ns)

    def _arm(self, due_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._tick_due_ns = due_ns
        delay_s = max(0.0, (due_ns - _EARLY_WAKE_NS - time.monotonic_ns()) / 1e9)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._tick)

    def _tick(self) -> None:
        due = self._tick_due_ns
        remaining = due - time.monotonic_ns()
        if remaining > 0:
            time.sleep(remaining / 1e9)
        record, monotonic_ns = self.log.record, time.monotonic_ns
        for stream in self.streams:
            if stream.conn.closed or due < stream.first_due_ns:
                continue
            index = stream.next_index
            transport = stream.conn.transport
            transport.write(stream.frames[index])
            sent = monotonic_ns()
            record(stream.response_id, due, sent, stream.tokens[index])
            if transport.get_write_buffer_size():
                self.buffered_writes += 1
            stream.next_index = index + 1
            if stream.next_index == len(stream.frames):
                transport.write(stream.tail)
                stream.conn.stream_done()
        for stream in self.streams:
            if stream.finished and stream.next_index < len(stream.frames):
                self.closed_early += 1
        self.streams = [s for s in self.streams if not s.finished]
        self._timer = None
        if self.streams:
            self._arm(due + self.config.period_ns)

    def first_due_ns(self, now_ns: int) -> int:
        """The first grid tick at or after the request's arrival plus TTFT."""
        period = self.config.period_ns
        earliest = now_ns + round(self.config.ttft_ms * 1e6)
        return -(-earliest // period) * period

    # -- requests ----------------------------------------------------------------------------------------

    def template_for(self, job: Job) -> Template:
        key = (
            tuple(job.prompt_token_ids) if job.return_token_ids else len(job.prompt_token_ids),
            job.max_tokens,
            job.include_usage,
            job.continuous_usage,
            job.return_token_ids,
        )
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = build_template(job, self.config)
        return template

    def reset(self) -> dict[str, Any]:
        """Start a new log (streams still open keep their schedule), so one server serves many trials."""
        self.log = SendLog(server={**self.log.server, "kind": "truth", **asdict(self.config)})
        self.buffered_writes = self.closed_early = 0
        return {}

    def log_json(self) -> dict[str, Any]:
        self.log.server["buffered_writes"] = self.buffered_writes
        self.log.server["streams_closed_early"] = self.closed_early
        return self.log.to_json()


def raise_priority() -> str:
    """Best effort: on a shared machine the stick must not wait for a core. The server sleeps between
    ticks, so a real-time class costs others nothing but its own short bursts of writes."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_REALTIME_PRIORITY))
        return f"SCHED_FIFO {_REALTIME_PRIORITY}"
    except (AttributeError, OSError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "default"


async def serve_truth(config: TruthConfig, host: str, port: int, log_path: Path | None) -> None:
    """Serve until SIGTERM/SIGINT, then write the send log (when asked to)."""
    server = TruthServer(config)
    server.log.server["scheduling"] = raise_priority()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Connection(server), host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with listener:
        await stop.wait()
    if log_path is not None:
        log_path.write_text(json.dumps(server.log_json()), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m itlaudit.serve.truth", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks-per-s", type=float, default=TruthConfig.chunks_per_s)
    parser.add_argument("--tokens-per-chunk", type=int, default=TruthConfig.tokens_per_chunk)
    parser.add_argument("--ttft-ms", type=float, default=TruthConfig.ttft_ms)
    parser.add_argument("--model", default=TruthConfig.model)
    parser.add_argument("--log", type=Path, help="write the send log here on exit (also GET /truth/log)")
    args = parser.parse_args(argv)
    try:
        config = TruthConfig(args.chunks_per_s, args.tokens_per_chunk, args.ttft_ms, args.model)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(serve_truth(config, args.host, args.port, args.log))


if __name__ == "__main__":
    main()
