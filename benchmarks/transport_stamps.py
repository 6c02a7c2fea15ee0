"""How much of loop-mode stamping lag kernel stamps remove when the client's loop is loaded.

A paced SSE server runs in its own process: one timer drives every open stream, and each chunk carries
the server's time.monotonic_ns() taken just before it was written (the clock is system-wide, so the
client can compare). The client streams through itlaudit.capture.transport with half of its streams in
`kernel` mode and half in `loop` mode at once, on one loop, so that both meet exactly the same load (on
a shared machine, rounds run one after the other see different loads). Loads: one stream per mode;
N streams in all; one stream per mode while the loop also runs a busy callback of 2 ms every 10 ms;
and of 20 ms every 100 ms, longer than the gap between chunks, which shows the limit of kernel stamps:
Linux TCP merges segments that arrive while the socket is not read, and the merged bytes carry the
receipt time of the last one ("merged": chunks delivered by a read that also delivered the next one;
"unmerged p99": the stamp delay of the chunks that were the last of their read, all kernel stamps fix).

Two figures per chunk: stamp - send time (one host, one clock: the stamping delay itself, ~10 µs of
loopback included), and issue 13's added lag = (stamp - the stream's first stamp) - (send time - the
first send time), which needs no shared clock but inherits any delay of the stream's first chunk.
The client's CPU per chunk is measured apart, one mode at a time, at N streams.

    .venv/bin/python benchmarks/transport_stamps.py [--streams 64] [--chunks-per-s 200] [--chunks 200]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from itlaudit.capture.transport import StampMode, TransportOptions, kernel_stamps_supported, open_stream


def serve(chunks_per_s: float, chunks: int) -> None:
    """The paced server (child process): prints its port, then streams until killed."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    print(listener.getsockname()[1], flush=True)
    joining: list[socket.socket] = []
    lock = threading.Lock()

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            with lock:
                joining.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    period_ns = int(1e9 / chunks_per_s)
    streams: list[list] = []  # [socket, chunks sent]
    tick = time.monotonic_ns()
    while True:
        tick += period_ns
        delay = tick - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        with lock:
            streams.extend([conn, 0] for conn in joining)
            joining.clear()
        for stream in streams:
            payload = b"data: %d\n\n" % time.monotonic_ns()
            stream[0].sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
            stream[1] += 1
            if stream[1] == chunks:
                stream[0].sendall(b"0\r\n\r\n")
                stream[0].close()
        streams = [stream for stream in streams if stream[1] < chunks]


async def one_stream(url: str, mode: StampMode) -> list[tuple[int, int]]:
    """(stamp, send time) per SSE event; the reading itself does only what a capture loop does."""
    stream = await open_stream(url, b"{}", {}, TransportOptions(stamp=mode))
    assert stream.stamp == mode, f"asked for {mode}, got {stream.stamp}"
    pieces = []
    while (piece := await stream.read(30)) is not None:
        pieces.append(piece)
    await stream.aclose()
    events = []
    pending = b""
    for stamp, data in pieces:
        pending += data
        *complete, pending = pending.split(b"\n\n")
        events.extend((stamp, int(event.removeprefix(b"data: "))) for event in complete)
    return events


def start_busy(loop: asyncio.AbstractEventLoop, busy_s: float, every_s: float) -> Callable[[], None]:
    """A callback that burns `busy_s` of CPU on the loop every `every_s`; returns its stopper."""
    handle: asyncio.TimerHandle | None = None

    def burn() -> None:
        nonlocal handle
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        handle = loop.call_later(every_s - busy_s, burn)

    handle = loop.call_later(every_s, burn)
    return lambda: handle.cancel() if handle is not None else None


@dataclass(frozen=True)
class Load:
    name: str
    streams_per_mode: int
    busy_s: float = 0.0
    busy_every_s: float = 0.0


@dataclass
class Lags:
    """Per chunk (a stream's first left out), in ms: stamp - send time, issue 13's added lag, and whether
    the read that stamped it also delivered the next chunk."""

    delay: list[np.ndarray] = field(default_factory=list)
    added: list[np.ndarray] = field(default_factory=list)
    merged: list[np.ndarray] = field(default_factory=list)

    def add(self, events: list[tuple[int, int]]) -> None:
        stamps = np.array([stamp for stamp, _ in events], dtype=np.int64)
        sends = np.array([sent for _, sent in events], dtype=np.int64)
        self.delay.append((stamps[1:] - sends[1:]) / 1e6)
        self.added.append(((stamps[1:] - stamps[0]) - (sends[1:] - sends[0])) / 1e6)
        self.merged.append(np.append(stamps[1:-1] == stamps[2:], False))


async def run_round(url: str, load: Load, modes: list[StampMode], lags: dict[tuple[str, str], Lags]) -> None:
    """All modes' streams at once, modes alternating, so that every mode meets the same load."""
    stop_busy = (
        start_busy(asyncio.get_running_loop(), load.busy_s, load.busy_every_s) if load.busy_s else None
    )
    stream_modes = modes * load.streams_per_mode
    try:
        results = await asyncio.gather(*(one_stream(url, mode) for mode in stream_modes))
    finally:
        if stop_busy is not None:
            stop_busy()
    for mode, events in zip(stream_modes, results, strict=True):
        lags[(load.name, mode)].add(events)


async def measure(
    url: str, loads: list[Load], modes: list[StampMode], rounds: int
) -> dict[tuple[str, str], Lags]:
    lags = {(load.name, mode): Lags() for load in loads for mode in modes}
    for _ in range(rounds):
        for load in loads:
            await run_round(url, load, modes, lags)
    return lags


async def cpu_per_chunk_us(url: str, streams: int, mode: StampMode) -> float:
    start = time.process_time()
    results = await asyncio.gather(*(one_stream(url, mode) for _ in range(streams)))
    return (time.process_time() - start) / sum(len(events) for events in results) * 1e6


def print_table(loads: list[Load], modes: list[StampMode], lags: dict[tuple[str, str], Lags]) -> None:
    print(
        f"{'load':<48} {'mode':<6} {'chunks':>6} {'merged':>6} | {'stamp - send p50':>16} {'p99':>7} "
        f"{'max':>7} {'unmerged p99':>12} | {'added lag p50':>13} {'p99':>7} {'max':>7}"
    )
    for load in loads:
        delay_p99, unmerged_p99 = {}, {}
        for mode in modes:
            row = lags[(load.name, mode)]
            delay, added, merged = (np.concatenate(part) for part in (row.delay, row.added, row.merged))
            d50, delay_p99[mode] = np.percentile(delay, [50, 99])
            a50, a99 = np.percentile(added, [50, 99])
            unmerged_p99[mode] = np.percentile(delay[~merged], 99)
            print(
                f"{load.name:<48} {mode:<6} {len(delay):>6} {merged.mean():>6.1%} | {d50:>16.3f} "
                f"{delay_p99[mode]:>7.3f} {delay.max():>7.3f} {unmerged_p99[mode]:>12.3f} "
                f"| {a50:>13.3f} {a99:>7.3f} {added.max():>7.3f}"
            )
        removed = 1 - delay_p99["kernel"] / delay_p99["loop"]
        removed_unmerged = 1 - unmerged_p99["kernel"] / unmerged_p99["loop"]
        print(
            f"{'':<48} kernel stamps remove {removed:.0%} of loop mode's p99 stamp delay, "
            f"{removed_unmerged:.0%} for the chunks that ended their read"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64, help="in all, half per mode")
    parser.add_argument("--chunks-per-s", type=float, default=200.0, help="per stream")
    parser.add_argument("--chunks", type=int, default=200, help="per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.chunks_per_s, args.chunks)
        return
    if not kernel_stamps_supported():
        sys.exit("kernel stamps (SO_TIMESTAMPNS) are not supported here: nothing to compare")
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--chunks-per-s",
            str(args.chunks_per_s),
            "--chunks",
            str(args.chunks),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1/completions"
        loads = [
            Load("1 stream per mode", 1),
            Load(f"{args.streams} streams ({args.streams // 2} per mode)", max(args.streams // 2, 1)),
            Load("1 stream per mode, loop busy 2 ms every 10 ms", 1, 0.002, 0.010),
            Load("1 stream per mode, loop busy 20 ms every 100 ms", 1, 0.020, 0.100),
        ]
        modes: list[StampMode] = ["kernel", "loop"]
        lags = asyncio.run(measure(url, loads, modes, args.rounds))
        cpu = {mode: asyncio.run(cpu_per_chunk_us(url, args.streams, mode)) for mode in modes}
    finally:
        server.kill()
        server.wait()
    print(f"{args.chunks_per_s:g} chunks/s per stream, {args.chunks} per stream, {args.rounds} rounds; ms:")
    print_table(loads, modes, lags)
    print(
        f"client CPU per chunk at {args.streams} streams, one mode at a time: "
        + ", ".join(f"{mode} {us:.1f} µs" for mode, us in cpu.items())
    )


if __name__ == "__main__":
    main()
