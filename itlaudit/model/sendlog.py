"""The send log: when a server wrote each content chunk of each response, on the machine's monotonic clock.

Written by the ground-truth server and by `itlaudit sim --send-log`, read by the fidelity analysis. A
client on the same host stamps receipts with the same CLOCK_MONOTONIC, but the analysis only ever uses
differences within one response, so the two processes never need a shared time origin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from itlaudit.errors import RecordsError
from itlaudit.model.jsonvalue import JSONObject

SEND_LOG_FORMAT = "itlaudit-send-log/1"


@dataclass
class ResponseSends:
    """One response's content chunks in send order: when each was due, when its write returned, and the
    cumulative completion tokens it carried (the key that joins it to the client's chunks)."""

    due_ns: list[int] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


@dataclass
class SendLog:
    # What the server was (its kind, its config, its write counters): free-form, as each server has it.
    server: JSONObject = field(default_factory=dict)
    responses: dict[str, ResponseSends] = field(default_factory=dict)

    def record(self, response_id: str, due_ns: int, sent_ns: int, tokens: int) -> None:
        sends = self.responses.get(response_id)
        if sends is None:
            sends = self.responses[response_id] = ResponseSends()
        sends.due_ns.append(due_ns)
        sends.sent_ns.append(sent_ns)
        sends.tokens.append(tokens)

    def to_json(self) -> JSONObject:
        """The file's JSON form (and the truth server's /truth/log answer)."""
        return {
            "format": SEND_LOG_FORMAT,
            "clock": "CLOCK_MONOTONIC ns (time.monotonic_ns), taken right after the chunk's write",
            "server": self.server,
            "responses": {
                rid: {"due_ns": [*s.due_ns], "sent_ns": [*s.sent_ns], "tokens": [*s.tokens]}
                for rid, s in self.responses.items()
            },
        }

    @classmethod
    def from_json(cls, data: JSONObject) -> SendLog:
        if data.get("format") != SEND_LOG_FORMAT:
            raise RecordsError(
                f"not a send log (format {data.get('format')!r}, expected {SEND_LOG_FORMAT!r})"
            )
        server = data.get("server", {})
        if not isinstance(server, dict):
            raise RecordsError(f"send log: `server` must be an object, got {server!r}")
        try:
            responses = msgspec.convert(data["responses"], dict[str, ResponseSends])
        except msgspec.ValidationError as exc:
            raise RecordsError(f"send log: `responses` holds a damaged entry ({exc})") from None
        return cls(server=server, responses=responses)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> SendLog:
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RecordsError(f"{path}: cannot read the send log ({exc}); rerun with --send-log") from exc
