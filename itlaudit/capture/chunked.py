"""Chunked transfer coding (RFC 9112 7.1), decoded once per socket read.

h11 turns each read into two or three events through dozens of Python calls, where `Dechunker` cuts the
common read - size line, data, CRLF - with one `find`, one regex match and one slice (the client's CPU per
SSE chunk at 16 streams fell from ~50 to ~33 µs: `benchmarks/capture_cpu.py`).
"""

from __future__ import annotations

import re

# RFC 9112 chunk-size [ chunk-ext ] (BWS before a ";" allowed), at most 20 hex digits as h11, OWS at the end.
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:[ \t]*;[^\r\n]*)?[ \t]*")
_MAX_LINE_BYTES = 16 * 1024  # a size or trailer line longer than this is garbage, not a slow sender


class FramingError(Exception):
    """A chunked body that breaks RFC 9112 7.1; Stream turns it into BadFraming with the peer's name."""


class Dechunker:
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
                        raise FramingError(f"chunk data not followed by CRLF: {data[position:]!r}")
                    self._pending = data[position:]
                    break
                if data[position : position + 2] != b"\r\n":
                    raise FramingError(f"chunk data not followed by CRLF: {data[position : position + 8]!r}")
                self._crlf = False
                position += 2
            else:
                end = data.find(b"\r\n", position)
                if end < 0:
                    if size - position > _MAX_LINE_BYTES:
                        raise FramingError(f"chunk size line longer than {_MAX_LINE_BYTES} bytes")
                    self._pending = data[position:]
                    break
                line = data[position:end]
                position = end + 2
                if self._trailer:
                    if not line:
                        self.done = True
                    elif b":" not in line:
                        raise FramingError(f"illegal trailer line: {line[:40]!r}")
                    continue
                match = _CHUNK_SIZE_LINE.fullmatch(line)
                if match is None:
                    raise FramingError(f"illegal chunk header: {line[:40]!r}")
                self._remaining = int(match[1], 16)
                self._trailer = not self._remaining
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)
