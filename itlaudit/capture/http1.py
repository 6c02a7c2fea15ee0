"""One HTTP/1.1 exchange over stamped reads: the request, the response head, the body piece by piece.

h11 parses the response head and frames content-length and close-delimited bodies. A chunked body (what
every SSE server sends) is de-chunked by `chunked` instead, once per socket read. https in kernel mode runs
through ``ssl.SSLObject`` over memory BIOs, so the decrypted bytes still come from the stamped reads. A TLS
EOF without close_notify counts as a plain EOF, as asyncio treats it; the framing then decides whether the
body was complete.

The request asks for `Accept-Encoding: identity`. A server that compresses anyway (gzip or deflate, as a
proxy may) is decoded here, one `zlib` decompressobj call per socket read, so each decoded piece still
carries its own read's stamp: that is one C call per read, the same kind of work as de-chunking, and only
on such streams. A compressor that holds its output back delivers tokens in bursts; the stamps then say
so (chunks_coalesced), which is the truth about that server. Other codings (br, zstd) have no decoder in
the standard library and are refused by the client with a line naming the coding.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import h11

from itlaudit.capture.chunked import Dechunker, FramingError
from itlaudit.capture.stamping import READ_SIZE, Inbox
from itlaudit.errors import BadFraming, ConnectionDropped, TLSFailure, TransportError
from itlaudit.model.vocabulary import StampMode

_MESSAGE_CHARS = 200
# Content-Encoding → zlib wbits: gzip's header and trailer, or the zlib format that "deflate" names.
DECODED_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True)
class Target:
    tls: bool
    host: str  # for getaddrinfo and SNI: an IPv6 literal without brackets
    port: int
    authority: str  # the Host header: IPv6 bracketed, port only when not the scheme's default
    path: str
    label: str  # host:port for messages


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:_MESSAGE_CHARS]


def tls_failure(target: Target, exc: ssl.SSLError) -> TLSFailure:
    reason = getattr(exc, "verify_message", None) or exc.reason or one_line(exc)
    return TLSFailure(
        f"TLS with {target.label} failed: {reason} (trust its CA with --ca-cert, or pass --insecure)"
    )


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
                plain = self.tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                return
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                plain = b""
            sink(plain)
            if not plain:
                return


class Stream:
    """One streaming response: its head, and its body piece by piece, each piece with its read's stamp."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    content_type: str
    content_encoding: str  # lower-cased; "" when the body is not encoded
    stamp: StampMode
    t_sent_ns: int

    def __init__(
        self,
        target: Target,
        stamp: StampMode,
        inbox: Inbox,
        send_raw: Callable[[bytes], Awaitable[None]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.status = 0
        self.reason = ""
        self.headers = []
        self.content_type = ""
        self.content_encoding = ""
        self.stamp = stamp
        self.t_sent_ns = 0
        self._target = target
        self._loop = asyncio.get_running_loop()
        self._inbox = inbox
        self._send_raw = send_raw
        self._close = close
        self._tls: _TLSPipe | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._dechunker: Dechunker | None = None  # a chunked body: de-chunked here, not by h11
        self._decoder: zlib._Decompress | None = None  # a gzip/deflate body: decoded per read
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
        if self._decoder is not None:
            return await self._read_decoded(timeout_s)
        if self._dechunker is not None:
            return await self._read_chunked(timeout_s)
        return await self._read_h11(timeout_s)

    async def _read_decoded(self, timeout_s: float | None) -> tuple[int, bytes] | None:
        """read() of a compressed body: each framed piece decoded as it comes, with its read's stamp. A
        piece that completes no output (a gzip header, say) is read past; the timeout applies per read."""
        decoder = self._decoder
        assert decoder is not None
        while True:
            got = await (self._read_chunked if self._dechunker is not None else self._read_h11)(timeout_s)
            try:
                if got is None:
                    tail = decoder.flush()
                    return (self._stamp, tail) if tail else None
                data = decoder.decompress(got[1])
            except zlib.error as exc:
                raise BadFraming(
                    f"{self._target.label} sent a {self.content_encoding} body that does not decode: "
                    f"{one_line(exc)}"
                ) from None
            if data:
                return got[0], data

    async def _read_h11(self, timeout_s: float | None) -> tuple[int, bytes] | None:
        """read() of a content-length or close-delimited body, framed by h11."""
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
                            f"the connection to {self._target.label} broke: {one_line(inbox.failure)}"
                        )
                    self._eof = True
                    continue
                if self._tls is not None:
                    data = await self._decrypt(data)  # b"" for part of a record; a TLS close sets _eof
            try:
                body = dechunker.feed(data)
            except FramingError as exc:
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
            raise tls_failure(self._target, exc) from None
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
                    f"the connection to {self._target.label} broke: {one_line(inbox.failure)}"
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
        return BadFraming(f"{self._target.label} sent a malformed {part}: {one_line(exc)}")

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
                raise tls_failure(self._target, exc) from None
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
            "accept-encoding": ("Accept-Encoding", "identity"),
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
        self.t_sent_ns = time.monotonic_ns()
        try:
            await self._send_raw(data)
        except OSError as exc:
            raise ConnectionDropped(
                f"{target.label} dropped the connection while the request was sent: {one_line(exc)}"
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
        coding = next((value for name, value in self.headers if name == "content-encoding"), "")
        self.content_encoding = "" if coding.strip().lower() in ("", "identity") else coding.strip().lower()
        wbits = DECODED_CODINGS.get(self.content_encoding)
        if wbits is not None:
            self._decoder = zlib.decompressobj(wbits)
        # h11 refuses any transfer coding but chunked, and 204/304 have no body whatever their headers say.
        if self.status not in (204, 304) and any(name == "transfer-encoding" for name, _ in self.headers):
            self._dechunker = Dechunker()
            self._head_rest = bytes(conn.trailing_data[0])  # body bytes that came with the head's read
