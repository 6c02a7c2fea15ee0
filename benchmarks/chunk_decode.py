"""Per-chunk decode cost of the SSE payloads a capture sees: msgspec (typed, only the kept fields) vs
orjson vs json (whole object, then the same fields picked out).

Run: `.venv/bin/python benchmarks/chunk_decode.py`. Payloads are the data events of the real vLLM
captures in tests/fixtures (completions with token ids, chat). Figures are µs per chunk, best of 7.
"""

from __future__ import annotations

import json
import timeit
from pathlib import Path
from typing import Any

import orjson

from itlaudit.capture.chunk import decode_chunk
from itlaudit.capture.sse import SSEFramer

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def payloads() -> list[bytes]:
    out: list[bytes] = []
    for capture in sorted(FIXTURES.glob("vllm-*/*.sse")):
        out += [p for p in SSEFramer().feed(capture.read_bytes()) if p != b"[DONE]"]
    return out


def pick(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What the record keeps from a generic decode, so each decoder does the same work."""
    usage = obj.get("usage") or {}
    choices = obj.get("choices") or [{}]
    choice = choices[0]
    delta = choice.get("delta") or {}
    return (
        obj.get("id"),
        usage.get("completion_tokens"),
        choice.get("text") or delta.get("content"),
        choice.get("token_ids"),
        choice.get("finish_reason"),
    )


def main() -> None:
    chunks = payloads()
    framed = b"".join(b"data: " + p + b"\n\n" for p in chunks)
    cases = {
        "msgspec (typed struct)": lambda: [decode_chunk(p) for p in chunks],
        "orjson + pick": lambda: [pick(orjson.loads(p)) for p in chunks],
        "json + pick": lambda: [pick(json.loads(p)) for p in chunks],
        "SSE framing (per chunk)": lambda: SSEFramer().feed(framed),
    }
    print(f"{len(chunks)} vLLM chunks, mean {sum(map(len, chunks)) / len(chunks):.0f} bytes")
    for name, fn in cases.items():
        best = min(timeit.repeat(fn, number=200, repeat=7)) / 200 / len(chunks)
        print(f"{name:26s} {best * 1e6:6.2f} µs/chunk")


if __name__ == "__main__":
    main()
