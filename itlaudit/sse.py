"""Incremental Server-Sent Events parser (WHATWG HTML "event stream interpretation").

The client stamps each TCP read with its receipt time and needs to know which events that read
completed, so parsing has to be incremental over arbitrary byte pieces rather than over a finished
body. It runs once per read on the hot path: lines are split with `bytes.splitlines` (which, unlike
`str.splitlines`, splits only on LF, CR and CRLF, exactly the SSE line endings) and fields are matched
as bytes, so Python-level work is per line, never per byte.

Decoding per complete line is equivalent to decoding the whole stream first: CR, LF and ':' are ASCII
and cannot occur inside a multi-byte UTF-8 sequence, so a character split across reads is always
reassembled before it is decoded. Invalid bytes become U+FFFD, as browsers do.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_CR = 0x0D


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event.

    `id` and `retry` are stream state at dispatch time, not per-event values: per the spec the last
    event ID persists until an `id` field changes it, and `retry` is the reconnection time (ms) most
    recently set by the stream; both are None until the stream first sets them.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Feed bytes as they arrive; each `feed` returns the events completed by that piece.

    Following the spec, an event still open when the stream ends (no blank line after it) is never
    dispatched, so there is no flush: a caller that sees the body end simply stops feeding.
    """

    __slots__ = (
        "_at_stream_start",
        "_bom_probe",
        "_data_lines",
        "_event_type",
        "_last_event_id",
        "_retry",
        "_skip_leading_lf",
        "_unterminated",
    )

    def __init__(self) -> None:
        self._at_stream_start = True
        self._bom_probe = b""  # first bytes held back until they can be told apart from a BOM
        self._skip_leading_lf = False  # previous piece ended in CR: an LF opening the next finishes it
        self._unterminated: list[bytes] = []  # pieces of a line whose ending has not arrived yet
        self._data_lines: list[str] = []
        self._event_type = ""
        self._last_event_id: str | None = None
        self._retry: int | None = None

    @property
    def last_event_id(self) -> str | None:
        return self._last_event_id

    @property
    def retry(self) -> int | None:
        return self._retry

    def feed(self, data: bytes) -> list[SSEEvent]:
        if self._skip_leading_lf and data:
            self._skip_leading_lf = False
            if data[0] == _LF:
                data = data[1:]
        if self._at_stream_start:
            data = self._bom_probe + data
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._bom_probe = data
                return []
            self._at_stream_start = False
            self._bom_probe = b""
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        if not data:
            return []
        if data.find(b"\n") < 0 and data.find(b"\r") < 0:
            self._unterminated.append(data)
            return []
        if self._unterminated:
            self._unterminated.append(data)
            data = b"".join(self._unterminated)
            self._unterminated.clear()

        lines = data.splitlines(keepends=True)
        last_byte = lines[-1][-1]
        if last_byte == _CR:
            self._skip_leading_lf = True
        elif last_byte != _LF:
            self._unterminated.append(lines.pop())

        events: list[SSEEvent] = []
        for line in lines:
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            if not line:
                event = self._dispatch()
                if event is not None:
                    events.append(event)
                continue
            colon = line.find(b":")
            if colon == 0:
                continue  # comment
            if colon < 0:
                name, value = line, b""
            else:
                name = line[:colon]
                value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
            self._process_field(name, value)
        return events

    def _process_field(self, name: bytes, value: bytes) -> None:
        if name == b"data":
            self._data_lines.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            self._event_type = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._last_event_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():  # bytes.isdigit is ASCII-only
            self._retry = int(value)

    def _dispatch(self) -> SSEEvent | None:
        data_lines = self._data_lines
        event_type = self._event_type or "message"
        self._event_type = ""
        if not data_lines:
            return None
        self._data_lines = []
        return SSEEvent("\n".join(data_lines), event_type, self._last_event_id, self._retry)
