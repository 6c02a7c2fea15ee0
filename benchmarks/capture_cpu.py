"""CPU per chunk of the capture path alone: one process, `stream_request` against the truth server.

The truth server runs in its own process, so this process's CPU time (user + system, RUSAGE_SELF) over
the streaming is the client's own cost: transport reads, de-chunking, SSE framing, decoding, appending.
Divided by the chunks received it is the figure issue 13's CPU budget is about. Each round also runs
the naive aiohttp readline client of `client_fidelity.py` in this same process against the same server
and prints its CPU per chunk and the ratio, so a loaded machine moves both alike. This is the capture
loop alone; the all-in figure (the whole `itlaudit run` process tree: coordinator, workers, sampler,
writer) is `client_fidelity.py`'s CPU column. `--profile` adds a cProfile listing of the capture rounds
(which inflates the totals; use it for the split, not the figure). `--stages` prints the split without a
profiler: one recorded stream's reads replayed through each stage on its own, best of 20 passes, and what
the stages leave of the measured loop is the event loop's (poll, handles, task wake-ups).

    .venv/bin/python benchmarks/capture_cpu.py --streams 16 --tokens 500
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from client_fidelity import naive_client

from itlaudit.capture import stamping
from itlaudit.capture.chunk import decode_chunk
from itlaudit.capture.chunked import Dechunker
from itlaudit.capture.client import StreamOptions, _read_stream, stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.capture.sse import SSEFramer
from itlaudit.model.records import RequestParams, Timeouts
from itlaudit.model.vocabulary import StampMode
from itlaudit.serve.truth import TruthConfig
from itlaudit.workflows.selfcheck import truth_server


def _cpu_s() -> tuple[float, float]:
    """This process's (user, system) CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


async def _capture(base_url: str, streams: int, tokens: int, stamp: str) -> int:
    plans = [
        plan_request(
            base_url=base_url,
            endpoint="completions",
            model="truth",
            prompt="cpu",
            params=RequestParams(max_tokens=tokens, ignore_eos=True),
            request_id=f"cpu-{i}",
            variant="truth",
        )
        for i in range(streams)
    ]
    options = StreamOptions(stamp=StampMode(stamp))
    records = await asyncio.gather(*(stream_request(plan, options) for plan in plans))
    bad = [r.error for r in records if r.status != "ok"]
    if bad:
        raise SystemExit(f"capture failed: {bad[0]}")
    return sum(len(r.chunks.t_ms) for r in records)


def _naive(base_url: str, streams: int, tokens: int, round_no: int) -> int:
    responses = asyncio.run(naive_client(base_url, streams, tokens, f"naive-{round_no}"))
    return sum(len(series["t_ms"]) for series in responses.values())


def _best_us(work: Callable[[], object], count: int, passes: int = 20) -> float:
    """Best CPU µs per item of `work` over `passes` passes (the least disturbed by the machine's load)."""
    best = float("inf")
    for _ in range(passes):
        started = time.process_time_ns()
        work()
        best = min(best, (time.process_time_ns() - started) / count)
    return best / 1e3


def _record_reads(base_url: str, tokens: int) -> list[bytes]:
    """One stream's socket reads, as the kernel-stamped reader handed them over (its head's read first)."""
    reads: list[bytes] = []
    put = stamping.Inbox.put

    def keep(inbox: stamping.Inbox, stamp: int, data: bytes) -> None:
        reads.append(data)
        put(inbox, stamp, data)

    stamping.Inbox.put = keep  # type: ignore[method-assign]
    try:
        asyncio.run(_capture(base_url, 1, tokens, "kernel"))
    finally:
        stamping.Inbox.put = put  # type: ignore[method-assign]
    return [data for data in reads[1:] if data]


class _Replay:
    """A Stream stand-in whose reads return recorded body pieces at once: the read loop with no waiting."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)

    async def read(self, _timeout_s: float | None) -> tuple[int, bytes] | None:
        piece = next(self._pieces, None)
        return None if piece is None else (1, piece)


def _read_loop(plan: Any, bodies: list[bytes]) -> None:
    coroutine = _read_stream(_Replay(bodies), plan.new_record(), 0, False, Timeouts())  # type: ignore[arg-type]
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise RuntimeError("the replayed read loop waited")


def _socket_read_us(reads: list[bytes]) -> float:
    """KernelReader's callback on a loopback socket whose read is already queued (recvmsg, the kernel
    stamp's conversion, the inbox): best of 5 passes over the recorded reads."""
    loop = asyncio.new_event_loop()
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as ours,
    ):
        peer, _ = listener.accept()
        ours.setsockopt(socket.SOL_SOCKET, stamping.SO_TIMESTAMPNS, 1)
        ours.setblocking(False)
        inbox = stamping.Inbox(loop)
        reader = stamping.KernelReader(loop, ours, inbox)
        best = float("inf")
        with peer:
            for _ in range(5):
                used = 0
                for data in reads:
                    peer.sendall(data)
                    started = time.process_time_ns()
                    reader._on_readable()
                    used += time.process_time_ns() - started
                    while inbox.pieces:
                        inbox.popleft()
                best = min(best, used / len(reads))
        reader.stop()
    loop.close()
    return best / 1e3


def _wake_us(count: int = 20000) -> float:
    """One task woken through a future by a callback, as each read wakes its stream's task."""

    async def roundtrips() -> None:
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[bool]] = []

        async def consumer() -> None:
            for _ in range(count):
                waiting.append(loop.create_future())
                await waiting[-1]

        def producer() -> None:
            if waiting and not waiting[-1].done():
                waiting[-1].set_result(True)
            if not task.done():
                loop.call_soon(producer)

        task = asyncio.ensure_future(consumer())
        loop.call_soon(producer)
        await task

    return _best_us(lambda: asyncio.run(roundtrips()), count, passes=3)


def _stages(base_url: str, tokens: int) -> None:
    """The capture loop's stages on their own, in µs per read or per chunk (module docstring)."""
    reads = _record_reads(base_url, tokens)
    dechunker = Dechunker()
    bodies = [body for body in map(dechunker.feed, reads) if body]
    framer = SSEFramer()
    payloads = [p for body in bodies for p in framer.feed(body) if p != b"[DONE]"]
    chunks = len(payloads)
    plan = plan_request(
        base_url=base_url,
        endpoint="completions",
        model="truth",
        prompt="cpu",
        params=RequestParams(max_tokens=tokens),
        request_id="stages",
        variant="truth",
    )

    def dechunk() -> None:
        feed = Dechunker().feed
        for data in reads:
            feed(data)

    def frame() -> None:
        feed = SSEFramer().feed
        for body in bodies:
            feed(body)

    def decode() -> None:
        for payload in payloads:
            decode_chunk(payload)

    per_read = len(reads) / chunks
    rows = {
        "socket read + kernel stamp + inbox": _socket_read_us(reads) * per_read,
        "HTTP chunked decode": _best_us(dechunk, chunks),
        "SSE framing": _best_us(frame, chunks),
        "JSON decode (msgspec)": _best_us(decode, chunks),
    }
    loop_us = _best_us(lambda: _read_loop(plan, bodies), chunks)
    rows["record building (read loop less framing and decode)"] = (
        loop_us - rows["SSE framing"] - rows["JSON decode (msgspec)"]
    )
    rows["task wake-up per read (future, handle, task step)"] = _wake_us() * per_read
    print(
        f"stages, one {tokens}-token stream: {len(reads)} body reads, {chunks} chunks; "
        "CPU µs per chunk, best of 20"
    )
    for name, value in rows.items():
        print(f"  {name:<55} {value:6.2f}")
    print(f"  {'sum':<55} {sum(rows.values()):6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--chunks-per-s", type=float, default=500.0)
    parser.add_argument("--stamp", choices=("kernel", "loop"), default="kernel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--stages", action="store_true", help="the per-stage split, then the rounds")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        truth_server(TruthConfig(args.chunks_per_s), Path(tmp)) as server,
    ):
        asyncio.run(_capture(server.url, 1, 10, args.stamp))  # warm-up: imports, kernel stamp keeper
        _naive(server.url, 1, 10, -1)  # and aiohttp's
        if args.stages:
            _stages(server.url, args.tokens)
        for round_no in range(args.rounds):
            # on CPU time, so that the loop's idle poll is not listed as a cost
            profiler = cProfile.Profile(time.process_time) if args.profile else None
            user, system = _cpu_s()
            if profiler is not None:
                profiler.enable()
            chunks = asyncio.run(_capture(server.url, args.streams, args.tokens, args.stamp))
            if profiler is not None:
                profiler.disable()
            after_user, after_system = _cpu_s()
            ours = (after_user + after_system - user - system) * 1e6 / chunks
            kernel = (after_system - system) * 1e6 / chunks
            naive_chunks = _naive(server.url, args.streams, args.tokens, round_no)
            naive = (sum(_cpu_s()) - after_user - after_system) * 1e6 / naive_chunks
            print(
                f"round {round_no + 1}: {args.streams} streams × {args.tokens} tokens, stamp {args.stamp}: "
                f"{chunks} chunks, CPU {ours:.1f} µs/chunk (system {kernel:.1f}); naive client "
                f"{naive:.1f} µs/chunk ({naive_chunks} chunks); ratio {ours / naive:.2f}",
                flush=True,
            )
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
