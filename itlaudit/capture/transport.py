"""HTTP/1.1 streaming client whose every read is stamped at the socket (issue 13).

aiohttp takes a chunk's receipt time when the reading task resumes, so under load the time includes
the wait behind every other task on the loop. Here each socket read is stamped where it leaves the socket
(`stamping`: kernel or loop stamps), and the response is parsed from those stamped reads (`http1`,
`chunked`). This module connects: it picks the stamping mode, resolves and connects (TCP, then TLS), and
hands back a Stream whose request is sent and whose response head is read.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from itlaudit.capture.http1 import Stream, Target, one_line, tls_failure
from itlaudit.capture.stamping import (
    SO_TIMESTAMPNS,
    Inbox,
    KernelReader,
    StampingProtocol,
    kernel_stamps_supported,
)
from itlaudit.errors import ConnectFailed, ConnectTimeout, TransportError
from itlaudit.model.vocabulary import StampMode

_DEFAULT_PORTS = {"http": 80, "https": 443}
_STAMP_MODES = tuple(StampMode)  # checked once a stream: a constant, as the literal pair was


@dataclass(frozen=True)
class TransportOptions:
    """How to connect; extra headers such as Authorization are passed per request, never stored."""

    # Falls back to loop stamps where unsupported (Stream.stamp says which ran).
    stamp: StampMode
    connect_timeout_s: float | None = 10.0
    ssl_context: ssl.SSLContext | None = None  # https: verified by default; the caller builds it

    def __post_init__(self) -> None:
        if self.stamp not in _STAMP_MODES:
            raise ValueError(
                f"stamp must be {' or '.join(repr(m.value) for m in StampMode)}, not {self.stamp!r}"
            )


def _parse_url(url: str) -> Target:
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
    return Target(scheme == "https", host, port, authority, path, f"{bracketed}:{port}")


def _connect_failure(target: Target, exc: OSError) -> ConnectFailed:
    if exc.errno and not isinstance(exc, socket.gaierror):  # asyncio's strerror is "Connect call failed ..."
        reason = os.strerror(exc.errno)
    else:
        reason = exc.strerror or one_line(exc)
    return ConnectFailed(
        f"cannot connect to {target.label}: {reason} (is the server up, and the URL's host and port right?)"
    )


async def _open_loop(target: Target, context: ssl.SSLContext | None) -> Stream:
    loop = asyncio.get_running_loop()
    inbox = Inbox(loop)
    lost: asyncio.Future[None] = loop.create_future()
    try:
        transport, _protocol = await loop.create_connection(
            lambda: StampingProtocol(inbox, lost),
            target.host,
            target.port,
            ssl=context,
            server_hostname=target.host if context is not None else None,
        )
    except ssl.SSLError as exc:
        raise tls_failure(target, exc) from None
    except OSError as exc:
        raise _connect_failure(target, exc) from None

    async def send_raw(data: bytes) -> None:
        transport.write(data)

    async def close() -> None:
        transport.abort()
        await lost

    return Stream(target, StampMode.LOOP, inbox, send_raw, close)


async def _connect_socket(target: Target) -> socket.socket:
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
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
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


async def _open_kernel(target: Target, context: ssl.SSLContext | None) -> Stream:
    loop = asyncio.get_running_loop()
    sock = await _connect_socket(target)
    inbox = Inbox(loop)
    reader = KernelReader(loop, sock, inbox)

    async def send_raw(data: bytes) -> None:
        await loop.sock_sendall(sock, data)

    async def close() -> None:
        reader.stop()
        sock.close()

    stream = Stream(target, StampMode.KERNEL, inbox, send_raw, close)
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
    opener = _open_kernel if options.stamp == StampMode.KERNEL and kernel_stamps_supported() else _open_loop
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
