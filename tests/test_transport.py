"""The stamped HTTP/1.1 transport against small scripted servers on 127.0.0.1 (threads, blocking sockets).

The servers run in threads so that the client's loop can be blocked on purpose while they keep sending;
they record a monotonic_ns pair around every send, the same clock the client stamps with.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest

from itlaudit.capture import stamping, transport
from itlaudit.capture.chunked import Dechunker
from itlaudit.capture.transport import (
    Stream,
    TransportOptions,
    kernel_stamps_supported,
    open_stream,
)
from itlaudit.errors import (
    BadFraming,
    ConnectFailed,
    ConnectionDropped,
    ConnectTimeout,
    ItlauditError,
    TLSFailure,
    TransportError,
)

MODES = [
    pytest.param(
        "kernel",
        marks=pytest.mark.skipif(not kernel_stamps_supported(), reason="no SO_TIMESTAMPNS on this platform"),
    ),
    "loop",
]
MS = 1_000_000
RESET = "reset"  # script step: close with an RST instead of a FIN
HOLD = "hold"  # script step: keep the connection open until the test ends
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
BODY = b"".join(b'data: {"n": %d, "pad": "%s"}\n\n' % (n, b"x" * (n % 97)) for n in range(300))

Step = bytes | float | threading.Event | str


class ScriptedServer:
    """Accepts one connection, reads the request, then plays `steps`: bytes are sent (with a monotonic_ns
    pair recorded around the send), a float sleeps, an Event is waited for, HOLD waits for the test's end,
    RESET aborts."""

    def __init__(self, steps: list[Step], tls: ssl.SSLContext | None = None, backlog: int = 1) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.steps = steps
        self.tls = tls
        self.request = b""
        self.sent: list[tuple[int, int]] = []
        self.release = threading.Event()  # a step that holds the connection open until teardown
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            conn.settimeout(10)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self._play(conn)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def _play(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            received = conn.recv(65536)
            if not received:
                return
            data += received
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += conn.recv(65536)
        self.request = data[: len(head) + 4] + body
        for step in self.steps:
            if isinstance(step, bytes):
                before = time.monotonic_ns()
                conn.sendall(step)
                self.sent.append((before, time.monotonic_ns()))
            elif isinstance(step, float):
                time.sleep(step)
            elif isinstance(step, threading.Event):
                step.wait(10)
            elif step == HOLD:
                self.release.wait(10)
            elif step == RESET:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/v1/completions"

    def wait_sent(self, count: int) -> None:
        """Blocks (the caller's loop too, on purpose) until `count` sends have completed."""
        deadline = time.monotonic() + 10
        while len(self.sent) < count and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(self.sent) >= count

    def close(self) -> None:
        self.release.set()
        self.listener.close()
        self.thread.join(10)


@pytest.fixture
def serve() -> Iterator[type[ScriptedServer]]:
    servers: list[ScriptedServer] = []

    class Tracked(ScriptedServer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            servers.append(self)

    yield Tracked
    for server in servers:
        server.close()


def chunked(*pieces: bytes) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces]


async def read_all(stream: Stream) -> list[tuple[int, bytes]]:
    pieces = []
    while (piece := await stream.read(5)) is not None:
        pieces.append(piece)
    return pieces


async def open_test_stream(url: str, mode: str, **options: object) -> Stream:
    return await open_stream(url, b'{"prompt": "hi"}', {}, TransportOptions(stamp=mode, **options))  # type: ignore[arg-type]


FRAMINGS = {
    "content-length": [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY),
        BODY[:1000],
        0.01,
        BODY[1000:1001],
        0.01,
        BODY[1001:],
    ],
    "chunked": [
        CHUNKED_HEAD,
        *chunked(BODY[:1], BODY[1:5000]),
        b"%x\r\n" % (len(BODY) - 5000),
        0.01,
        BODY[5000:7000],
        0.01,
        BODY[7000:] + b"\r\n0\r\n\r\n",
    ],
    "close-delimited": [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY[:10], 0.01, BODY[10:]],
    # Sizes, extensions, the data's CRLF and the trailers cut across reads; body bytes in the head's read.
    "chunked, split framing": [
        CHUNKED_HEAD + b"1",
        0.01,
        b"0;name=value\r\n" + BODY[:16] + b"\r",
        0.01,
        b"\n%x ; ext\r" % (len(BODY) - 16),
        0.01,
        b"\n" + BODY[16:] + b"\r\n0;last\r\nX-Trailer: 1\r",
        0.01,
        b"\n\r\n",
    ],
}


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_body_round_trips_exactly(serve: type[ScriptedServer], mode: str, framing: str) -> None:
    server = serve(FRAMINGS[framing])
    stream = await open_stream(
        server.url(), b'{"prompt": "hi"}', {"Authorization": "Bearer k"}, TransportOptions(stamp=mode)
    )
    pieces = await read_all(stream)
    await stream.aclose()
    assert stream.status == 200
    assert stream.stamp == mode
    assert b"".join(data for _, data in pieces) == BODY
    assert all(type(data) is bytes for _, data in pieces)
    stamps = [stamp for stamp, _ in pieces]
    assert stamps == sorted(stamps)
    assert stream.t_sent_ns <= stamps[0]
    head = server.request.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"post /v1/completions http/1.1\r\n")
    for line in (
        b"host: 127.0.0.1:%d" % server.port,
        b"content-type: application/json",
        b"accept: text/event-stream",
        b"accept-encoding: identity",
        b"authorization: bearer k",
        b"content-length: 16",
    ):
        assert line in head.split(b"\r\n")
    assert server.request.endswith(b'\r\n\r\n{"prompt": "hi"}')


@pytest.mark.parametrize("mode", MODES)
async def test_paced_pieces_carry_their_own_stamps(serve: type[ScriptedServer], mode: str) -> None:
    server = serve(
        [CHUNKED_HEAD, 0.02, *chunked(b"one"), 0.05, *chunked(b"two"), 0.05, *chunked(b"three"), b"0\r\n\r\n"]
    )
    stream = await open_test_stream(server.url(), mode)
    pieces = await read_all(stream)
    await stream.aclose()
    assert [data for _, data in pieces] == [b"one", b"two", b"three"]
    stamps = [stamp for stamp, _ in pieces]
    # Sent >= 50 ms apart. A loop stamp can be late by however long this process waited for a core.
    least_gap = 40 * MS if mode == "kernel" else 30 * MS
    assert stamps[1] - stamps[0] >= least_gap
    assert stamps[2] - stamps[1] >= least_gap
    for stamp, (before, after) in zip(stamps, server.sent[1:4], strict=True):
        assert stamp >= before - MS  # received after it was sent (1 ms for the clock conversion)
        if mode == "kernel":  # on loopback the kernel receives inside the sender's send call
            assert stamp <= after + 5 * MS


@pytest.mark.skipif(not kernel_stamps_supported(), reason="no SO_TIMESTAMPNS on this platform")
async def test_a_blocked_loop_delays_loop_stamps_but_not_kernel_stamps(serve: type[ScriptedServer]) -> None:
    stamps: dict[str, int] = {}
    unblocked: dict[str, int] = {}
    for mode in ("kernel", "loop"):
        go = threading.Event()
        server = serve([CHUNKED_HEAD, go, *chunked(b"late"), HOLD])
        stream = await open_test_stream(server.url(), mode)
        go.set()
        server.wait_sent(2)  # the piece is in the client's socket now, and the loop is blocked
        time.sleep(0.05)
        unblocked[mode] = time.monotonic_ns()
        piece = await stream.read(5)
        await stream.aclose()
        assert piece is not None and piece[1] == b"late"
        stamps[mode] = piece[0]
        assert piece[0] >= server.sent[1][0] - MS
    assert stamps["kernel"] <= unblocked["kernel"] - 40 * MS
    assert stamps["loop"] >= unblocked["loop"]


@pytest.mark.parametrize("mode", MODES)
async def test_read_timeout_leaves_the_stream_usable(serve: type[ScriptedServer], mode: str) -> None:
    go = threading.Event()
    server = serve([CHUNKED_HEAD, go, *chunked(b"after"), b"0\r\n\r\n"])
    stream = await open_test_stream(server.url(), mode)
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{server.port}"):
        await stream.read(0.1)
    go.set()
    assert (await stream.read(5) or (0, b""))[1] == b"after"
    assert await stream.read(5) is None
    await stream.aclose()
    await stream.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_close_after_a_timeout_closes_the_socket(serve: type[ScriptedServer], mode: str) -> None:
    server = serve([CHUNKED_HEAD, HOLD])
    stream = await open_test_stream(server.url(), mode)
    with pytest.raises(TimeoutError):
        await stream.read(0.05)
    await stream.aclose()
    with pytest.raises(RuntimeError):
        await stream.read(1)


@pytest.mark.parametrize("mode", MODES)
async def test_aclose_ends_a_read_waiting_in_another_task(serve: type[ScriptedServer], mode: str) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial", HOLD])  # close-delimited
    stream = await open_test_stream(server.url(), mode)
    assert (await stream.read(5) or (0, b""))[1] == b"partial"
    waiting = asyncio.create_task(stream.read(5))
    await asyncio.sleep(0.05)
    await stream.aclose()
    with pytest.raises(ConnectionDropped, match="closed by aclose"):  # not a clean end of the body
        await waiting


class FakeTimestampingSocket:
    """Hands KernelReader canned recvmsg results; a real descriptor only so that add_reader accepts it."""

    def __init__(self, fd: int, replies: list[tuple[bytes, list[tuple[int, int, bytes]], int, None]]) -> None:
        self._fd = fd
        self.replies = replies

    def fileno(self) -> int:
        return self._fd

    def recvmsg(
        self, size: int, ancillary_size: int
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, None]:
        return self.replies.pop(0)


async def test_kernel_stamps_are_converted_to_monotonic_and_clamped() -> None:
    def received_at(wall_ns: int) -> list[tuple[int, int, bytes]]:
        return [(socket.SOL_SOCKET, stamping.SO_TIMESTAMPNS, struct.pack("@ll", *divmod(wall_ns, 10**9)))]

    monotonic, wall = time.monotonic_ns(), time.time_ns()
    replies = [
        (b"a", received_at(wall - 30 * MS), 0, None),  # received 30 ms before `monotonic`
        (b"b", received_at(wall + 10**9), 0, None),  # after the read itself (a wall-clock step): clamped
        (b"c", received_at(wall - 10**10), 0, None),  # before the previous read's stamp: clamped to it
        (b"d", [], 0, None),  # not stamped by the kernel: the read's own time
    ]
    loop = asyncio.get_running_loop()
    inbox = stamping.Inbox(loop)
    left, right = socket.socketpair()
    reader = stamping.KernelReader(loop, FakeTimestampingSocket(left.fileno(), replies), inbox)  # type: ignore[arg-type]
    windows = []
    try:
        for _ in range(4):
            before = time.monotonic_ns()
            reader._on_readable()
            windows.append((before, time.monotonic_ns()))
    finally:
        reader.stop()
        left.close()
        right.close()
    (a, _), (b, _), (c, _), (d, _) = inbox.pieces
    assert abs(a - (monotonic - 30 * MS)) < MS
    assert windows[1][0] <= b <= windows[1][1]
    assert c == b
    assert windows[3][0] <= d <= windows[3][1]


@pytest.mark.parametrize("mode", MODES)
async def test_connection_refused_is_connect_failed(mode: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]
    with pytest.raises(ConnectFailed, match=f"127.0.0.1:{port}: Connection refused") as caught:
        await open_test_stream(f"http://127.0.0.1:{port}/", mode)
    assert "\n" not in str(caught.value)
    assert not isinstance(caught.value, ConnectTimeout)


@pytest.mark.skipif(sys.platform != "linux", reason="relies on Linux dropping SYNs to a full accept queue")
@pytest.mark.parametrize("mode", MODES)
async def test_a_full_accept_queue_is_a_connect_timeout(mode: str) -> None:
    """Linux drops SYNs to a listener whose accept queue is full: the connect hangs with no other host."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectTimeout, match=f"127.0.0.1:{port} took longer than 0.3 s"):
            await open_test_stream(f"http://127.0.0.1:{port}/", mode, connect_timeout_s=0.3)
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


DROPS = {
    "short content-length": [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"],
    "chunked cut short": [CHUNKED_HEAD, *chunked(b"partial")],
    "reset mid-body": [CHUNKED_HEAD, *chunked(b"partial"), 0.02, RESET],
    "closed before the head": [],
}


@pytest.mark.parametrize("case", DROPS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_dropped_connection_is_connection_dropped(
    serve: type[ScriptedServer], mode: str, case: str
) -> None:
    server = serve(DROPS[case])
    with pytest.raises(ConnectionDropped, match=f"127.0.0.1:{server.port}"):
        stream = await open_test_stream(server.url(), mode)
        try:
            await read_all(stream)
        finally:
            await stream.aclose()


BROKEN = {
    "garbage head": [b"garbage\r\n\r\n"],
    "bad chunk size": [CHUNKED_HEAD, b"zz\r\nhello\r\n"],
    "bad chunk size, split": [CHUNKED_HEAD, b"5\r\nhello\r\n1", 0.01, b"g\r\n"],
    "chunk size too long": [CHUNKED_HEAD, b"1" * 21 + b"\r\n"],
    "data without its CRLF": [CHUNKED_HEAD, b"5\r\nhelloXY1\r\nz\r\n"],
    "bad trailer": [CHUNKED_HEAD, b"0\r\ngarbage\r\n\r\n"],
    "endless size line": [CHUNKED_HEAD, b"1" + b" " * 20_000],
}


def test_dechunker_agrees_with_h11_however_the_reads_fall() -> None:
    wire = b"".join(chunked(BODY[:1], BODY[1:300])) + b"a;x=1;y\t\r\n0123456789\r\n0\r\nT: 1\r\nU: 2\r\n\r\n"
    reference = h11.Connection(h11.CLIENT)
    reference.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    reference.send(h11.EndOfMessage())
    reference.receive_data(CHUNKED_HEAD + wire)
    expected = b""
    while type(event := reference.next_event()) is not h11.EndOfMessage:
        expected += bytes(event.data) if type(event) is h11.Data else b""
    assert expected == BODY[:300] + b"0123456789"
    for step in (1, 2, 3, 7, 64, len(wire)):
        dechunker = Dechunker()
        got = b"".join(dechunker.feed(wire[i : i + step]) for i in range(0, len(wire), step))
        assert (got, dechunker.done) == (expected, True), step


@pytest.mark.parametrize("case", BROKEN)
@pytest.mark.parametrize("mode", MODES)
async def test_broken_framing_is_bad_framing(serve: type[ScriptedServer], mode: str, case: str) -> None:
    server = serve([*BROKEN[case], HOLD])
    with pytest.raises(BadFraming, match=f"127.0.0.1:{server.port} sent a malformed response"):
        stream = await open_test_stream(server.url(), mode)
        try:
            await read_all(stream)
        finally:
            await stream.aclose()


def _compressed(coding: str, events: list[bytes]) -> list[bytes]:
    """Each event compressed and flushed on its own (Z_SYNC_FLUSH), as a streaming proxy sends them."""
    compressor = zlib.compressobj(wbits=31 if coding == "gzip" else 15)
    pieces = [compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH) for event in events]
    return [*pieces[:-1], pieces[-1] + compressor.flush()]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("framing", ["chunked", "close-delimited"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_compressed_body_is_decoded_piece_by_piece(
    serve: type[ScriptedServer], mode: str, framing: str, coding: str
) -> None:
    """Row 9 of the fault campaign: decoded as it comes, each event with the stamp of its own read."""
    events = [b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: %s\r\n" % coding.encode()
    pieces = _compressed(coding, events)
    if framing == "chunked":
        script: list[Step] = [head + b"Transfer-Encoding: chunked\r\n\r\n"]
        for piece in pieces:
            script += [0.03, *chunked(piece)]
        script.append(b"0\r\n\r\n")
    else:
        script = [head + b"Connection: close\r\n\r\n"]
        for piece in pieces:
            script += [0.03, piece]
    server = serve(script)
    stream = await open_test_stream(server.url(), mode)
    got = await read_all(stream)
    await stream.aclose()
    assert stream.content_encoding == coding
    assert [data for _, data in got] == events
    stamps = [stamp for stamp, _ in got]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3


@pytest.mark.parametrize("mode", MODES)
async def test_a_body_that_does_not_decode_is_bad_framing(serve: type[ScriptedServer], mode: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\r\n"
    server = serve([head + b"data: not gzip at all\n\n", HOLD])
    stream = await open_test_stream(server.url(), mode)
    try:
        with pytest.raises(BadFraming, match="gzip body that does not decode"):
            await read_all(stream)
    finally:
        await stream.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_a_redirect_comes_back_as_it_is(serve: type[ScriptedServer], mode: str) -> None:
    server = serve(
        [b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere/v1\r\nContent-Length: 0\r\n\r\n"]
    )
    stream = await open_test_stream(server.url(), mode)
    assert (stream.status, stream.reason) == (307, "Temporary Redirect")
    assert ("location", "https://elsewhere/v1") in stream.headers
    assert stream.content_type == ""
    assert await stream.read(5) is None
    await stream.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_a_host_name_is_resolved(serve: type[ScriptedServer], mode: str) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    stream = await open_test_stream(server.url(host="localhost"), mode)  # ::1 first on some hosts: refused
    assert [data for _, data in await read_all(stream)] == [b"ok"]
    await stream.aclose()
    assert b"host: localhost:%d\r\n" % server.port in server.request.lower()


async def test_kernel_falls_back_to_loop_where_unsupported(
    serve: type[ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "kernel_stamps_supported", lambda: False)
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    stream = await open_test_stream(server.url(), "kernel")
    assert stream.stamp == "loop"
    await stream.aclose()


@pytest.mark.parametrize(
    ("url", "message"),
    [("ftp://host/x", "use http:// or https://"), ("http:///x", "has no host"), ("http://h:99999/", "port")],
)
async def test_a_bad_url_is_one_line(url: str, message: str) -> None:
    with pytest.raises(TransportError, match=message):
        await open_test_stream(url, "loop")


def test_an_unknown_stamp_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="stamp must be 'kernel' or 'loop'"):
        TransportOptions(stamp="kernal")  # type: ignore[arg-type]


def test_transport_errors_are_itlaudit_errors() -> None:
    for error in (ConnectFailed, ConnectTimeout, TLSFailure, ConnectionDropped, BadFraming):
        assert issubclass(error, TransportError)
    assert issubclass(TransportError, ItlauditError)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate (its own CA) for 127.0.0.1; the key sits beside it as key.pem."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return folder / "cert.pem"


def server_tls(certificate: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, certificate.parent / "key.pem")
    return context


@pytest.mark.parametrize("mode", MODES)
async def test_https_streams_in_both_modes(serve: type[ScriptedServer], certificate: Path, mode: str) -> None:
    server = serve(FRAMINGS["chunked"], tls=server_tls(certificate))
    client = ssl.create_default_context(cafile=str(certificate))
    stream = await open_test_stream(server.url("https"), mode, ssl_context=client)
    pieces = await read_all(stream)
    await stream.aclose()
    assert stream.stamp == mode
    assert b"".join(data for _, data in pieces) == BODY
    assert [stamp for stamp, _ in pieces] == sorted(stamp for stamp, _ in pieces)


HTTPS_ENDINGS = {
    "chunked cut short": ([CHUNKED_HEAD, *chunked(b"partial")], None),
    "close-delimited, no close_notify": ([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY], BODY),
}


@pytest.mark.parametrize("case", HTTPS_ENDINGS)
@pytest.mark.parametrize("mode", MODES)
async def test_https_eof_ends_or_drops_as_the_framing_says(
    serve: type[ScriptedServer], certificate: Path, mode: str, case: str
) -> None:
    steps, body = HTTPS_ENDINGS[case]
    server = serve(steps, tls=server_tls(certificate))  # the server closes without a TLS close_notify
    client = ssl.create_default_context(cafile=str(certificate))
    stream = await open_test_stream(server.url("https"), mode, ssl_context=client)
    try:
        if body is None:
            with pytest.raises(ConnectionDropped):
                await read_all(stream)
        else:
            assert b"".join(data for _, data in await read_all(stream)) == body
    finally:
        await stream.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_https_without_the_ca_fails_verification(
    serve: type[ScriptedServer], certificate: Path, mode: str
) -> None:
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], tls=server_tls(certificate))
    with pytest.raises(TLSFailure, match=f"TLS with 127.0.0.1:{server.port} failed: self-signed certificate"):
        await open_test_stream(server.url("https"), mode)


@pytest.mark.parametrize("mode", MODES)
async def test_a_stalled_tls_handshake_is_a_connect_timeout(serve: type[ScriptedServer], mode: str) -> None:
    server = serve([HOLD])  # a plain-TCP server: it never answers the TLS handshake
    with pytest.raises(ConnectTimeout):
        await open_test_stream(server.url("https"), mode, connect_timeout_s=0.3)
