"""HTTP/1.1 streaming client whose every read is stamped at the socket (issue 13).

aiohttp takes a chunk's receipt time when the reading task resumes, so under load the time includes
the wait behind every other task on the loop. Here each socket read is stamped where it leaves the socket:

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

h11 parses the response head and frames content-length and close-delimited bodies. A chunked body (what
every SSE server sends) is de-chunked here instead, once per socket read: h11 turns each read into two or
three events through dozens of Python calls, where `_Dechunker` cuts the common read - size line, data,
CRLF - with one `find`, one regex match and one slice (the client's CPU per SSE chunk at 16 streams fell
from ~50 to ~33 µs: `benchmarks/capture_cpu.py`). A TLS EOF
without close_notify counts as a plain EOF, as asyncio treats it; the framing then decides whether the
body was complete.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import platform
import re
import socket
import ssl
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import h11

from itlaudit.errors import (
    BadFraming,
    ConnectFailed,
    ConnectionDropped,
    ConnectTimeout,
    TLSFailure,
    TransportError,
)

StampMode = Literal["kernel", "loop"]

# asm-generic value of SO_TIMESTAMPNS (= SCM_TIMESTAMPNS); the Python socket module does not export it.
# Alpha, MIPS, PA-RISC and SPARC number their socket options differently, hence the machine list.
_SO_TIMESTAMPNS = 35
_GENERIC_SOCKOPT_MACHINES = frozenset({"x86_64", "i686", "aarch64", "armv7l", "riscv64", "ppc64le", "s390x"})
_TIMESPEC = struct.Struct("@ll")  # struct timespec {time_t tv_sec; long tv_nsec;}
_ANCILLARY_SIZE = 64  # one cmsghdr + timespec needs 32 bytes on 64-bit Linux
# Per read, at most this much. asyncio's own 256 KiB recv costs ~13 µs more per read here than 64 KiB
# (a buffer that large is mmap'ed and unmapped every time): the bulk of a small SSE chunk's cost.
_READ_SIZE = 64 * 1024
_PAUSE_BYTES = 1 << 20  # a consumer this far behind stops the reads (the kernel buffers, and stamps)
_RESUME_BYTES = 1 << 18
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MESSAGE_CHARS = 200
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
        keeper.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
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
        client.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        server, _ = listener.accept()
        with server:
            for _ in range(50):
                server.sendall(b"x")
                _data, ancillary, _flags, _address = client.recvmsg(1, _ANCILLARY_SIZE)
                if any(kind == _SO_TIMESTAMPNS for _level, kind, _payload in ancillary):
                    return True
                time.sleep(0.002)
    return False


@dataclass(frozen=True)
class TransportOptions:
    """How to connect; extra headers such as Authorization are passed per request, never stored."""

    stamp: StampMode = "kernel"  # falls back to "loop" where unsupported (Stream.stamp says which ran)
    connect_timeout_s: float | None = 10.0
    ssl_context: ssl.SSLContext | None = None  # https: verified by default; the caller builds it

    def __post_init__(self) -> None:
        if self.stamp not in ("kernel", "loop"):
            raise ValueError(f"stamp must be 'kernel' or 'loop', not {self.stamp!r}")


@dataclass(frozen=True)
class _Target:
    tls: bool
    host: str  # for getaddrinfo and SNI: an IPv6 literal without brackets
    port: int
    authority: str  # the Host header: IPv6 bracketed, port only when not the scheme's default
    path: str
    label: str  # host:port for messages


def _parse_url(url: str) -> _Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise TransportError(f"cannot stream from a {scheme or 'scheme-less'} URL: use http:// or https://")
    host = parts.hostname
    if not host:
        raise TransportError(f"the {scheme} URL has no host: use {scheme}://HOST[:PORT]/PATH")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise TransportError(f"the port of the {scheme} URL for {host} is not a number in 1-65535") from None
    bracketed = f"[{host}]" if ":" in host else host
    authority = bracketed if port == _DEFAULT_PORTS[scheme] else f"{bracketed}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme == "https", host, port, authority, path, f"{bracketed}:{port}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:_MESSAGE_CHARS]


def _connect_failure(target: _Target, exc: OSError) -> ConnectFailed:
    if exc.errno and not isinstance(exc, socket.gaierror):  # asyncio's strerror is "Connect call failed ..."
        reason = os.strerror(exc.errno)
    else:
        reason = exc.strerror or _one_line(exc)
    return ConnectFailed(
        f"cannot connect to {target.label}: {reason} (is the server up, and the URL's host and port right?)"
    )


def _tls_failure(target: _Target, exc: ssl.SSLError) -> TLSFailure:
    reason = getattr(exc, "verify_message", None) or exc.reason or _one_line(exc)
    return TLSFailure(
        f"TLS with {target.label} failed: {reason} (trust its CA with --ca-cert, or pass --insecure)"
    )


class _Inbox:
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
        waiter = self._loop.create_future()
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


class _StampingProtocol(asyncio.BufferedProtocol):
    """Loop mode: the stamp is taken before anything else touches the bytes.

    A BufferedProtocol (buffer_updated is data_received for a buffer we own) so that the transport reads
    into one preallocated buffer instead of allocating 256 KiB per read.
    """

    def __init__(self, inbox: _Inbox, lost: asyncio.Future[None]) -> None:
        self._inbox = inbox
        self._lost = lost
        self._buffer = memoryview(bytearray(_READ_SIZE))

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


class _KernelReader:
    """Kernel mode: drains the socket when readable; each read carries the kernel's receipt time."""

    __slots__ = ("_fd", "_inbox", "_last", "_loop", "_offset", "_recvmsg", "ended")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, inbox: _Inbox) -> None:
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
            data, ancillary, _flags, _address = self._recvmsg(_READ_SIZE, _ANCILLARY_SIZE)
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
            if kind == _SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(payload) >= _TIMESPEC.size:
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


class _TLSPipe:
    """TLS over memory BIOs, so that what it decrypts still comes from the stamped recvmsg reads."""

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=host)

    def unwrap(self, data: bytes, sink: Callable[[bytes], None]) -> None:
        """Feeds one raw read (b"" = EOF) and hands every whole record's plaintext to `sink`, EOF as b""."""
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        while True:
            try:
                plain = self.tls.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                return
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                plain = b""
            sink(plain)
            if not plain:
                return


# RFC 9112 chunk-size [ chunk-ext ] (BWS before a ";" allowed), at most 20 hex digits as h11, OWS at the end.
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:[ \t]*;[^\r\n]*)?[ \t]*")
_MAX_LINE_BYTES = 16 * 1024  # a size or trailer line longer than this is garbage, not a slow sender


class _FramingError(Exception):
    """A chunked body that breaks RFC 9112 7.1; Stream turns it into BadFraming with the peer's name."""


class _Dechunker:
    """Chunked transfer coding, decoded incrementally over socket reads.

    `feed` takes one read and returns the body bytes it completed (b"" when it held only framing), so a
    piece still carries its own read's stamp. Sizes, extensions and trailers may be split anywhere across
    reads: an unfinished line waits in `_pending`. Extensions and trailer fields are read past, as h11 does.
    """

    __slots__ = ("_crlf", "_pending", "_remaining", "_trailer", "done")

    def __init__(self) -> None:
        self._pending = b""  # an unfinished size line, CRLF or trailer line
        self._remaining = 0  # data bytes left in the current chunk
        self._crlf = False  # the CRLF that closes a chunk's data is next
        self._trailer = False  # the last chunk was seen: trailer lines until a blank one
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        size = len(data)
        position = 0
        out: list[bytes] = []
        while position < size and not self.done:
            remaining = self._remaining
            if remaining:
                end = position + remaining
                if end > size:
                    end = size
                out.append(data[position:end])
                self._remaining = remaining - (end - position)
                self._crlf = not self._remaining
                position = end
            elif self._crlf:
                if size - position < 2:
                    if data[position:] != b"\r":
                        raise _FramingError(f"chunk data not followed by CRLF: {data[position:]!r}")
                    self._pending = data[position:]
                    break
                if data[position : position + 2] != b"\r\n":
                    raise _FramingError(f"chunk data not followed by CRLF: {data[position : position + 8]!r}")
                self._crlf = False
                position += 2
            else:
                end = data.find(b"\r\n", position)
                if end < 0:
                    if size - position > _MAX_LINE_BYTES:
                        raise _FramingError(f"chunk size line longer than {_MAX_LINE_BYTES} bytes")
                    self._pending = data[position:]
                    break
                line = data[position:end]
                position = end + 2
                if self._trailer:
                    if not line:
                        self.done = True
                    elif b":" not in line:
                        raise _FramingError(f"illegal trailer line: {line[:40]!r}")
                    continue
                match = _CHUNK_SIZE_LINE.fullmatch(line)
                if match is None:
                    raise _FramingError(f"illegal chunk header: {line[:40]!r}")
                self._remaining = int(match[1], 16)
                self._trailer = not self._remaining
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)


class Stream:
    """One streaming response: its head, and its body piece by piece, each piece with its read's stamp."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    content_type: str
    stamp: StampMode
    t_sent_ns: int
    t_head_ns: int

    def __init__(
        self,
        target: _Target,
        stamp: StampMode,
        inbox: _Inbox,
        send_raw: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.status = 0
        self.reason = ""
        self.headers = []
        self.content_type = ""
        self.stamp = stamp
        self.t_sent_ns = 0
        self.t_head_ns = 0
        self._target = target
        self._loop = asyncio.get_running_loop()
        self._inbox = inbox
        self._send_raw = send_raw
        self._close = close
        self._tls: _TLSPipe | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._dechunker: _Dechunker | None = None  # a chunked body: de-chunked here, not by h11
        self._head_rest = b""
        self._stamp = 0  # stamp of the last read fed to h11
        self._eof = False
        self._finished = False
        self._closed = False

    async def read(self, timeout_s: float | None) -> tuple[int, bytes] | None:
        """Next piece of the de-chunked body with the monotonic_ns stamp of the socket read that delivered
        its last byte; None at the end of the body. TimeoutError when nothing arrives within timeout_s
        (the stream stays usable); TransportError when the connection drops or the framing is broken."""
        if self._closed:
            raise RuntimeError("Stream.read() after aclose()")
        if self._finished:
            return None
        if self._dechunker is not None:
            return await self._read_chunked(timeout_s)
        conn = self._conn
        deadline = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._broken(exc) from None
            if event is h11.NEED_DATA:
                if deadline is None and timeout_s is not None:
                    deadline = self._loop.time() + timeout_s
                await self._feed(deadline, timeout_s)
            elif type(event) is h11.Data:
                return self._stamp, bytes(event.data)
            elif type(event) is h11.EndOfMessage:
                self._finished = True
                return None

    async def _read_chunked(self, timeout_s: float | None) -> tuple[int, bytes] | None:
        """read() of a chunked body: one socket read (its plaintext, over TLS) per returned piece."""
        dechunker = self._dechunker
        assert dechunker is not None
        inbox = self._inbox
        deadline = None
        while True:
            if dechunker.done:
                self._finished = True
                return None
            if self._eof:
                raise ConnectionDropped(
                    f"{self._target.label} closed the connection before the response body was complete"
                )
            if self._head_rest:  # plaintext already, stamped with the head's read
                stamp, data = self._stamp, self._head_rest
                self._head_rest = b""
            else:
                if not inbox.pieces:
                    if deadline is None and timeout_s is not None:
                        deadline = self._loop.time() + timeout_s
                    if not await inbox.wait(deadline):
                        raise TimeoutError(
                            f"nothing received from {self._target.label} within {timeout_s:g} s"
                        )
                stamp, data = inbox.popleft()
                if not data:
                    if inbox.failure is not None:
                        raise ConnectionDropped(
                            f"the connection to {self._target.label} broke: {_one_line(inbox.failure)}"
                        )
                    self._eof = True
                    continue
                if self._tls is not None:
                    data = await self._decrypt(data)  # b"" for part of a record; a TLS close sets _eof
            try:
                body = dechunker.feed(data)
            except _FramingError as exc:
                raise BadFraming(f"{self._target.label} sent a malformed response body: {exc}") from None
            if body:
                self._stamp = stamp
                return stamp, body

    async def aclose(self) -> None:
        """Closes the socket, whatever state the stream is in; idempotent. A read() waiting meanwhile in
        another task ends with ConnectionDropped, never with a clean end of a close-delimited body."""
        if not self._closed:
            self._closed = True
            self._inbox.end(ConnectionAbortedError("the stream was closed by aclose()"))
            await self._close()

    async def _decrypt(self, data: bytes) -> bytes:
        """The plaintext of one raw read; a TLS close within it marks the end of the connection."""
        plain: list[bytes] = []
        append = plain.append

        def sink(piece: bytes) -> None:
            if piece:
                append(piece)
            else:
                self._eof = True

        await self._unwrap(data, sink)
        return b"".join(plain)

    async def _unwrap(self, data: bytes, sink: Callable[[bytes], None]) -> None:
        tls = self._tls
        assert tls is not None
        try:
            tls.unwrap(data, sink)
        except ssl.SSLError as exc:
            raise _tls_failure(self._target, exc) from None
        if tls.outgoing.pending:  # a TLS 1.3 KeyUpdate answer, say
            await self._send_raw(tls.outgoing.read())

    async def _feed(self, deadline: float | None, timeout_s: float | None) -> None:
        """Gives h11 the next socket read (the decrypted part of it, for kernel-mode https)."""
        inbox = self._inbox
        if not inbox.pieces and not await inbox.wait(deadline):
            raise TimeoutError(f"nothing received from {self._target.label} within {timeout_s:g} s")
        stamp, data = inbox.popleft()
        if not data:
            if inbox.failure is not None:
                raise ConnectionDropped(
                    f"the connection to {self._target.label} broke: {_one_line(inbox.failure)}"
                )
            self._eof = True
        else:
            self._stamp = stamp
        if self._tls is None:
            self._conn.receive_data(data)
        else:
            await self._unwrap(data, self._conn.receive_data)

    def _broken(self, exc: h11.RemoteProtocolError) -> TransportError:
        part = "response body" if self.status else "response head"
        if self._eof:
            return ConnectionDropped(
                f"{self._target.label} closed the connection before the {part} was complete"
            )
        return BadFraming(f"{self._target.label} sent a malformed {part}: {_one_line(exc)}")

    async def _handshake(self, context: ssl.SSLContext) -> None:
        tls = self._tls = _TLSPipe(context, self._target.host)
        while True:
            try:
                tls.tls.do_handshake()
            except ssl.SSLWantReadError:
                if tls.outgoing.pending:
                    await self._send_raw(tls.outgoing.read())
                if not self._inbox.pieces:
                    await self._inbox.wait(None)
                _stamp, data = self._inbox.popleft()
                if not data:
                    raise TLSFailure(
                        f"TLS with {self._target.label} failed: the server closed the connection during "
                        "the handshake (is it an https server?)"
                    ) from None
                tls.incoming.write(data)
            except ssl.SSLError as exc:
                raise _tls_failure(self._target, exc) from None
            else:
                break
        if tls.outgoing.pending:
            await self._send_raw(tls.outgoing.read())

    async def _send_request(self, body: bytes, headers: Mapping[str, str]) -> None:
        target = self._target
        fields = {
            "host": ("Host", target.authority),
            "content-type": ("Content-Type", "application/json"),
            "accept": ("Accept", "text/event-stream"),
            "content-length": ("Content-Length", str(len(body))),
            "connection": ("Connection", "close"),
        }
        for name, value in headers.items():
            fields[name.lower()] = (name, value)
        try:
            request = self._conn.send(
                h11.Request(method="POST", target=target.path, headers=list(fields.values()))
            )
        except (h11.LocalProtocolError, UnicodeEncodeError):
            # The exception text would quote the header value, which may be a secret.
            raise TransportError(
                f"cannot send a request to {target.label}: a header name or value is not valid HTTP "
                "(look for line breaks or non-ASCII characters)"
            ) from None
        data = b"".join((request, self._conn.send(h11.Data(data=body)), self._conn.send(h11.EndOfMessage())))
        if self._tls is not None:
            self._tls.tls.write(data)
            data = self._tls.outgoing.read()
        self.t_sent_ns = _monotonic_ns()
        try:
            await self._send_raw(data)
        except OSError as exc:
            raise ConnectionDropped(
                f"{target.label} dropped the connection while the request was sent: {_one_line(exc)}"
            ) from None

    async def _read_head(self) -> None:
        conn = self._conn
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._broken(exc) from None
            if event is h11.NEED_DATA:
                await self._feed(None, None)
            elif type(event) is h11.Response:
                break
        self.status = event.status_code
        self.reason = event.reason.decode("latin-1")
        self.headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers]
        self.content_type = next((value for name, value in self.headers if name == "content-type"), "")
        self.t_head_ns = self._stamp
        # h11 refuses any transfer coding but chunked, and 204/304 have no body whatever their headers say.
        if self.status not in (204, 304) and any(name == "transfer-encoding" for name, _ in self.headers):
            self._dechunker = _Dechunker()
            self._head_rest = bytes(conn.trailing_data[0])  # body bytes that came with the head's read


async def _open_loop(target: _Target, context: ssl.SSLContext | None) -> Stream:
    loop = asyncio.get_running_loop()
    inbox = _Inbox(loop)
    lost: asyncio.Future[None] = loop.create_future()
    try:
        transport, _protocol = await loop.create_connection(
            lambda: _StampingProtocol(inbox, lost),
            target.host,
            target.port,
            ssl=context,
            server_hostname=target.host if context is not None else None,
        )
    except ssl.SSLError as exc:
        raise _tls_failure(target, exc) from None
    except OSError as exc:
        raise _connect_failure(target, exc) from None

    async def send_raw(data: bytes) -> None:
        transport.write(data)

    async def close() -> None:
        transport.abort()
        await lost

    return Stream(target, "loop", inbox, send_raw, close)


async def _connect_socket(target: _Target) -> socket.socket:
    """A connected non-blocking socket with kernel receive timestamps on, trying each address in turn."""
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _connect_failure(target, exc) from None
    failure: OSError = OSError(f"{target.host} has no address")
    for family, kind, proto, _name, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failure = exc
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    raise _connect_failure(target, failure)


async def _open_kernel(target: _Target, context: ssl.SSLContext | None) -> Stream:
    loop = asyncio.get_running_loop()
    sock = await _connect_socket(target)
    inbox = _Inbox(loop)
    reader = _KernelReader(loop, sock, inbox)

    async def send_raw(data: bytes) -> None:
        await loop.sock_sendall(sock, data)

    async def close() -> None:
        reader.stop()
        sock.close()

    stream = Stream(target, "kernel", inbox, send_raw, close)
    if context is not None:
        try:
            await stream._handshake(context)
        except BaseException:
            await stream.aclose()
            raise
    return stream


async def open_stream(url: str, body: bytes, headers: Mapping[str, str], options: TransportOptions) -> Stream:
    """Connects (http or https; IPv4/IPv6/hostnames), sends one POST with the body and headers
    (Content-Type: application/json, Accept: text/event-stream, plus the given headers), reads the
    response head. Raises TransportError subclasses on connect failure, connect timeout (TCP and TLS
    handshake together), TLS failure or a malformed response head. Does NOT follow redirects: a 3xx comes
    back as it is, Location among its headers. Waiting for the head has no timeout of its own; cancel the
    call (asyncio.timeout) to give up, which closes the socket."""
    target = _parse_url(url)
    context = (options.ssl_context or ssl.create_default_context()) if target.tls else None
    opener = _open_kernel if options.stamp == "kernel" and kernel_stamps_supported() else _open_loop
    try:
        async with asyncio.timeout(options.connect_timeout_s) as connect_timer:
            stream = await opener(target, context)
    except TimeoutError:
        if connect_timer.expired():
            raise ConnectTimeout(
                f"connecting to {target.label} took longer than {options.connect_timeout_s:g} s "
                "(is the host reachable? raise the connect timeout if it is just slow)"
            ) from None
        raise
    try:
        await stream._send_request(body, headers)
        await stream._read_head()
    except BaseException:
        await stream.aclose()
        raise
    return stream
