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

An unfinished event is held as the list of its pieces and joined once, when a blank line ends it: only
each new piece is searched for the blank line, so an event of n bytes costs O(n), not the O(n^2) of
joining and re-scanning the whole buffer on every read (a 50 MB event took 39 s that way). The spec has
no size limit; the reader has one, `MAX_EVENT_BYTES`, so a server that streams without ever ending an
event (an endless line) is cut there (`EventTooLarge`) instead of growing the client without bound.
"""

from __future__ import annotations

from itlaudit.errors import EventTooLarge

# One event's bytes at most: over ten times the 5 MB single event the campaign kept (row 4), above the
# 50 MB one it captured (N20); an OpenAI-compatible stream's events are deltas of a few KB.
MAX_EVENT_BYTES = 64 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"
_FAST_PREFIX = b"data: "


class SSEFramer:
    """Feed bytes as they arrive; each `feed` returns the data payloads of the events it completed
    (lines of one event's data joined by LF, as the spec's data buffer). EventTooLarge when the event
    being read has grown past `limit` bytes without ending."""

    __slots__ = ("_bom_head", "_limit", "_pending", "_pending_bytes", "_skip_leading_lf")

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._limit = limit
        self._bom_head: bytes | None = b""  # the stream's first bytes until a BOM is ruled out; then None
        self._skip_leading_lf = False  # previous piece ended in CR: an LF opening this one finishes it
        self._pending: list[bytes] = []  # the pieces after the last blank line: an event not yet complete
        self._pending_bytes = 0

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
        if self._bom_head is not None:
            data = self._past_bom(data)
            if not data:
                return []
        pending = self._pending
        end = data.rfind(b"\n\n")
        if pending:
            # Only the new piece can hold the blank line, or it opens with the LF that ends one.
            if end < 0:
                if data[0] != 0x0A or pending[-1][-1] != 0x0A:
                    pending.append(data)
                    self._pending_bytes += len(data)
                    if self._pending_bytes > self._limit:
                        raise EventTooLarge(
                            f"the server sent an event over the reader's {self._limit // 2**20} MiB "
                            "event limit (no blank line ended it)"
                        )
                    return []
                end = -1  # the blank line's first LF is the held event's last byte
            end += self._pending_bytes
            pending.append(data)
            buffer = b"".join(pending)
            pending.clear()
        elif end < 0:
            # A piece that ends one line of a multi-line event still completes no event.
            pending.append(data)
            self._pending_bytes = len(data)
            return []
        else:
            buffer = data
        if end + 2 < len(buffer):
            rest = buffer[end + 2 :]
            pending.append(rest)
            self._pending_bytes = len(rest)
        payloads: list[bytes] = []
        for block in buffer[:end].split(b"\n\n"):
            if block.startswith(_FAST_PREFIX) and b"\n" not in block:
                payloads.append(block[6:])
            elif block:
                payload = _event_data(block)
                if payload is not None:
                    payloads.append(payload)
        return payloads

    def _past_bom(self, data: bytes) -> bytes:
        """The stream's opening bytes without a leading BOM; b"" while too few have come to tell."""
        head = (self._bom_head or b"") + data
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._bom_head = head
            return b""
        self._bom_head = None
        return head[len(_BOM) :] if head.startswith(_BOM) else head


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
