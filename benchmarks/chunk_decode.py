"""Per-chunk decode cost of the SSE payloads a capture sees: msgspec (typed, only the kept fields) vs
orjson vs json (whole object, then the same fields picked out).

Run: `.venv/bin/python benchmarks/chunk_decode.py`. Payloads are the data events of the real vLLM
captures in tests/fixtures (completions with token ids, chat). Figures are µs per chunk, best of 7.
Then SGLang's /generate (capture/chunk.py's GenerateDecoder): one 500-token stream in SGLang
0.5.12.post1's layout, text and output_ids cumulative (its default) and in pieces
(--incremental-streaming-output); the cumulative one's cost per chunk is what grows with the output.
"""

from __future__ import annotations

import json
import timeit
from pathlib import Path
from typing import Any

from itlaudit.capture.chunk import GenerateDecoder, decode_chunk
from itlaudit.capture.sse import SSEFramer

try:  # not one of itlaudit's dependencies: compared where it is installed
    import orjson
except ImportError:
    orjson = None

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


def generate_stream(tokens: int, incremental: bool) -> list[bytes]:
    """One /generate stream's events, one token each (tokenizer_manager.py `_handle_batch_output`)."""
    events = []
    for n in range(1, tokens + 1):
        meta = {"id": "r", "finish_reason": None, "prompt_tokens": 8, "weight_version": "default"}
        meta |= {"total_retractions": 0, "completion_tokens": n, "cached_tokens": 0}
        text = f" w{n}" if incremental else "".join(f" w{i}" for i in range(1, n + 1))
        ids = [1000 + n] if incremental else list(range(1001, 1001 + n))
        events.append(json.dumps({"text": text, "output_ids": ids, "meta_info": meta}).encode())
    return events


def main() -> None:
    chunks = payloads()
    framed = b"".join(b"data: " + p + b"\n\n" for p in chunks)
    cases = {
        "msgspec (typed struct)": lambda: [decode_chunk(p) for p in chunks],
        "json + pick": lambda: [pick(json.loads(p)) for p in chunks],
        "SSE framing (per chunk)": lambda: SSEFramer().feed(framed),
    }
    if orjson is not None:
        cases["orjson + pick"] = lambda: [pick(orjson.loads(p)) for p in chunks]
    print(f"{len(chunks)} vLLM chunks, mean {sum(map(len, chunks)) / len(chunks):.0f} bytes")
    for name, fn in cases.items():
        best = min(timeit.repeat(fn, number=200, repeat=7)) / 200 / len(chunks)
        print(f"{name:26s} {best * 1e6:6.2f} µs/chunk")
    for incremental in (False, True):
        events = generate_stream(500, incremental)

        def stream(events: list[bytes] = events) -> None:
            decode = GenerateDecoder().decode
            for event in events:
                decode(event)

        best = min(timeit.repeat(stream, number=20, repeat=7)) / 20 / len(events)
        name = f"/generate, {'pieces' if incremental else 'cumulative'}"
        print(f"{name:26s} {best * 1e6:6.2f} µs/chunk (500-token stream)")


if __name__ == "__main__":
    main()
