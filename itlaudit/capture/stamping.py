"""Socket reads stamped where they leave the socket, in one of two modes.

- ``kernel`` (Linux): SO_TIMESTAMPNS makes the kernel attach its own receipt time to every recvmsg.
  A reader callback (``loop.add_reader``) drains the socket into a queue; a busy loop delays when a read
  is *handled*, not the time it carries. https runs through ``ssl.SSLObject`` over memory BIOs, so the
  decrypted bytes still come from the stamped reads.
- ``loop``: an asyncio protocol stamps ``time.monotonic_ns()`` first thing in ``buffer_updated`` (the
  BufferedProtocol's data_received; https through asyncio's own TLS). Better than a resumed task,
  still late by however long the loop was busy when the bytes arrived.

Kernel stamps are CLOCK_REALTIME; right after each recvmsg the offset between the clocks is sampled as
(m0, wall, m1), offset = wall - (m0 + m1) / 2, and the stamp becomes ``kernel - offset``. A sample is
used only when m1 - m0 <= 2 µs (typically 0.2 µs; a preemption between the clock reads widens it, 31 µs
was seen under load); otherwise the last tight offset serves. The conversion error is therefore at most
1 µs plus however far CLOCK_REALTIME was slewed between the tight sample and the packet's receipt
(NTP slews at most 500 ppm: 25 µs over 50 ms). A step of the wall clock cannot push a stamp outside
[previous stamp, m0]: stamps are clamped there, so they stay ordered and never later than a loop stamp.

Limit of kernel stamps: Linux TCP coalesces segments that queue up while nobody reads the socket, and
the merged bytes carry the receipt time of the *last* segment (reading in smaller pieces does not get
the earlier times back). A chunk that ends its read is stamped exactly however late the read; a chunk
merged with later ones is late by the gap to the last of them. So kernel stamps remove the delay from
the last arrival to the read, not a stall that spans several chunks: keeping each loop's lag below the
gap between chunks is still what bounds the tail (benchmarks/transport_stamps.py shows both).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable

# asm-generic value of SO_TIMESTAMPNS (= SCM_TIMESTAMPNS); the Python socket module does not export it.
# Alpha, MIPS, PA-RISC and SPARC number their socket options differently, hence the machine list.
SO_TIMESTAMPNS = 35
_GENERIC_SOCKOPT_MACHINES = frozenset({"x86_64", "i686", "aarch64", "armv7l", "riscv64", "ppc64le", "s390x"})
_TIMESPEC = struct.Struct("@ll")  # struct timespec {time_t tv_sec; long tv_nsec;}
_ANCILLARY_SIZE = 64  # one cmsghdr + timespec needs 32 bytes on 64-bit Linux
# Per read, at most this much. asyncio's own 256 KiB recv costs ~13 µs more per read here than 64 KiB
# (a buffer that large is mmap'ed and unmapped every time): the bulk of a small SSE chunk's cost.
READ_SIZE = 64 * 1024
_PAUSE_BYTES = 1 << 20  # a consumer this far behind stops the reads (the kernel buffers, and stamps)
_RESUME_BYTES = 1 << 18
_TIGHT_SAMPLE_NS = 2_000  # a clock-offset sample this narrow bounds the conversion error by 1 µs

_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns


@functools.cache
def kernel_stamps_supported() -> bool:
    """True where SO_TIMESTAMPNS (Linux) is available.

    Linux switches receive timestamping on system-wide only while some socket asks for it, and switches
    it on in deferred work: a socket opened while it is off gets unstamped packets for a while (a quarter
    of fresh loopback connections did here). So the first call opens a keeper socket that holds it on for
    the life of the process and waits (up to ~0.1 s, once) until a loopback probe shows a stamp, which also
    proves that the platform really delivers them rather than just accepting the option.
    """
    if sys.platform != "linux" or platform.machine().lower() not in _GENERIC_SOCKOPT_MACHINES:
        return False
    keeper = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        if _loopback_delivers_stamps():
            _KEEPERS.append(keeper)
            return True
    except OSError:
        pass
    keeper.close()
    return False


_KEEPERS: list[socket.socket] = []


def _loopback_delivers_stamps() -> bool:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
    ):
        client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        server, _ = listener.accept()
        with server:
            for _ in range(50):
                server.sendall(b"x")
                _data, ancillary, _flags, _address = client.recvmsg(1, _ANCILLARY_SIZE)
                if any(kind == SO_TIMESTAMPNS for _level, kind, _payload in ancillary):
                    return True
                time.sleep(0.002)
    return False


class Inbox:
    """(stamp, bytes) per socket read, in order, with the one reader waiting for them.

    An empty bytes object marks the end; `failure` then says whether it was an error.

    Read timeouts use one timer per stream that is moved only when it fires: arming and cancelling a
    timer for every wait (a handle, a heap push and pop per chunk) cost ~5 µs per chunk here, and a deadline
    almost always moves later, so the timer firing at the old one just re-arms for the current one.
    """

    __slots__ = (
        "_deadline",
        "_loop",
        "_timer",
        "_timer_at",
        "_waiter",
        "ended",
        "failure",
        "pause",
        "paused",
        "pieces",
        "queued",
        "resume",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiter: asyncio.Future[bool] | None = None
        self._deadline: float | None = None  # the waiting reader's
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.pieces: collections.deque[tuple[int, bytes]] = collections.deque()
        self.queued = 0
        self.ended = False
        self.failure: BaseException | None = None
        self.paused = False
        self.pause: Callable[[], None] = _nothing
        self.resume: Callable[[], None] = _nothing

    def put(self, stamp: int, data: bytes) -> None:
        self.pieces.append((stamp, data))
        self.queued += len(data)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)
        if self.queued > _PAUSE_BYTES and not self.paused:
            self.paused = True
            self.pause()

    def end(self, failure: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self.failure = failure
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.put(0, b"")

    def popleft(self) -> tuple[int, bytes]:
        piece = self.pieces.popleft()
        self.queued -= len(piece[1])
        if self.paused and self.queued < _RESUME_BYTES:
            self.paused = False
            self.resume()
        return piece

    async def wait(self, deadline: float | None) -> bool:
        """Until a piece is queued (True) or the loop time reaches `deadline` (False)."""
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self._waiter = waiter
        self._deadline = deadline
        if deadline is not None and (self._timer is None or self._timer_at > deadline):
            self._arm(deadline)
        try:
            return await waiter
        finally:
            self._waiter = None

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return  # nobody waits with a deadline: the next wait arms a timer again
        if deadline <= self._timer_at:
            waiter.set_result(False)
        else:
            self._arm(deadline)


def _nothing() -> None:
    return None


class StampingProtocol(asyncio.BufferedProtocol):
    """Loop mode: the stamp is taken before anything else touches the bytes.

    A BufferedProtocol (buffer_updated is data_received for a buffer we own) so that the transport reads
    into one preallocated buffer instead of allocating 256 KiB per read.
    """

    def __init__(self, inbox: Inbox, lost: asyncio.Future[None]) -> None:
        self._inbox = inbox
        self._lost = lost
        self._buffer = memoryview(bytearray(READ_SIZE))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._inbox.pause = transport.pause_reading
        self._inbox.resume = transport.resume_reading

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        stamp = _monotonic_ns()
        self._inbox.put(stamp, bytes(self._buffer[:nbytes]))

    def eof_received(self) -> None:
        self._inbox.end(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inbox.end(exc)
        if not self._lost.done():
            self._lost.set_result(None)


class KernelReader:
    """Kernel mode: drains the socket when readable; each read carries the kernel's receipt time."""

    __slots__ = ("_fd", "_inbox", "_last", "_loop", "_offset", "_recvmsg", "ended")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, inbox: Inbox) -> None:
        self._loop = loop
        self._fd = sock.fileno()
        self._recvmsg = sock.recvmsg
        self._inbox = inbox
        self._last = 0
        self._offset: int | None = None  # CLOCK_REALTIME - CLOCK_MONOTONIC, from the last tight sample
        self.ended = False
        inbox.pause = self._pause
        inbox.resume = self._resume
        loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data, ancillary, _flags, _address = self._recvmsg(READ_SIZE, _ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.stop()
            self._inbox.end(exc)
            return
        before = _monotonic_ns()
        wall = _time_ns()
        after = _monotonic_ns()
        if not data:
            self.stop()
            self._inbox.end(None)
            return
        if after - before <= _TIGHT_SAMPLE_NS or self._offset is None:
            self._offset = wall - ((before + after) >> 1)
        stamp = before
        for level, kind, payload in ancillary:
            if kind == SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                received = seconds * 1_000_000_000 + nanoseconds - self._offset
                if received < stamp:
                    stamp = received if received > self._last else self._last
        self._last = stamp
        self._inbox.put(stamp, data)

    def _pause(self) -> None:
        self._loop.remove_reader(self._fd)

    def _resume(self) -> None:
        if not self.ended:
            self._loop.add_reader(self._fd, self._on_readable)

    def stop(self) -> None:
        if not self.ended:
            self.ended = True
            self._loop.remove_reader(self._fd)
