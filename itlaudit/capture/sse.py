"""Incremental Server-Sent Events framing (WHATWG HTML "event stream interpretation"), data only.

The capture loop stamps each socket read and needs the `data` payloads that read completed, so framing
is incremental over arbitrary byte pieces. It runs once per read on the loop while other streams wait,
so it does the least the spec allows: line endings are normalised to LF per piece (a CR ending one
piece and an LF opening the next are one CRLF), complete events are cut at blank lines with
`bytes.split`, and the common `data: <json>` event is recognised with one prefix test. Payloads stay
bytes: the JSON decoder reads bytes, and a decoded str per event would be work nobody uses.

The client reads only data, so `event`, `id` and `retry` fields are parsed past, not kept: vLLM and
OpenAI-compatible servers send unnamed events whose only field is `data`. An event still open when the
stream ends (no blank line after it) is never dispatched, as the spec says.
"""

from __future__ import annotations

__all__ = ["SSEFramer"]

_BOM = b"\xef\xbb\xbf"
_FAST_PREFIX = b"data: "


class SSEFramer:
    """Feed bytes as they arrive; each `feed` returns the data payloads of the events it completed
    (lines of one event's data joined by LF, as the spec's data buffer)."""

    __slots__ = ("_at_stream_start", "_pending", "_skip_leading_lf")

    def __init__(self) -> None:
        self._at_stream_start = True
        self._skip_leading_lf = False  # previous piece ended in CR: an LF opening this one finishes it
        self._pending = b""  # bytes after the last blank line: an event not yet complete

    def feed(self, data: bytes) -> list[bytes]:
        if self._skip_leading_lf and data:
            self._skip_leading_lf = False
            if data[0] == 0x0A:
                data = data[1:]
        if not data:
            return []
        self._skip_leading_lf = data[-1] == 0x0D
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._pending + data if self._pending else data
        if self._at_stream_start:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._pending = buffer
                return []
            self._at_stream_start = False
            if buffer.startswith(_BOM):
                buffer = buffer[len(_BOM) :]
        end = buffer.rfind(b"\n\n")
        if end < 0:
            # A piece that ends one line of a multi-line event still completes no event.
            self._pending = buffer
            return []
        self._pending = buffer[end + 2 :]
        payloads: list[bytes] = []
        for block in buffer[:end].split(b"\n\n"):
            if block.startswith(_FAST_PREFIX) and b"\n" not in block:
                payloads.append(block[6:])
            elif block:
                payload = _event_data(block)
                if payload is not None:
                    payloads.append(payload)
        return payloads


def _event_data(block: bytes) -> bytes | None:
    """The data buffer of one event's lines (the slow path: comments, other fields, several data
    lines, `data:` without the space); None when the event had no data field (not dispatched)."""
    data_lines: list[bytes] = []
    for line in block.split(b"\n"):
        colon = line.find(b":")
        if colon == 0 or not line:
            continue  # comment, or a blank line left by three or more newlines in a row
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if name == b"data":
            data_lines.append(value)
    if not data_lines:
        return None
    return b"\n".join(data_lines)
