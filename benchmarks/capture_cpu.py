"""CPU per chunk of the capture path alone: one process, `stream_request` against the truth server.

The truth server runs in its own process, so this process's CPU time (user + system, RUSAGE_SELF) over
the streaming is the client's own cost: transport reads, de-chunking, SSE framing, decoding, appending.
Divided by the chunks received it is the figure issue 13's CPU budget is about. `--profile` adds a
cProfile listing (which inflates the totals; use it for the split, not the figure).

    .venv/bin/python benchmarks/capture_cpu.py --streams 16 --tokens 500
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import tempfile
from pathlib import Path

from itlaudit.capture.client import stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.model.records import RequestParams
from itlaudit.serve.truth import TruthConfig
from itlaudit.workflows.selfcheck import truth_server


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _capture(base_url: str, streams: int, tokens: int, stamp: str) -> int:
    plans = [
        plan_request(
            base_url=base_url,
            endpoint="completions",
            model="truth",
            prompt="cpu",
            params=RequestParams(max_tokens=tokens, ignore_eos=True),
            request_id=f"cpu-{i}",
            variant="truth",
        )
        for i in range(streams)
    ]
    records = await asyncio.gather(*(stream_request(plan, stamp=stamp) for plan in plans))  # type: ignore[arg-type]
    bad = [r.error for r in records if r.status != "ok"]
    if bad:
        raise SystemExit(f"capture failed: {bad[0]}")
    return sum(len(r.chunks.t_ms) for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--chunks-per-s", type=float, default=500.0)
    parser.add_argument("--stamp", choices=("kernel", "loop"), default="kernel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        truth_server(TruthConfig(args.chunks_per_s), Path(tmp)) as server,
    ):
        asyncio.run(_capture(server.url, 1, 10, args.stamp))  # warm-up: imports, kernel stamp keeper
        for round_no in range(args.rounds):
            profiler = cProfile.Profile() if args.profile else None
            before = _cpu_s()
            if profiler is not None:
                profiler.enable()
            chunks = asyncio.run(_capture(server.url, args.streams, args.tokens, args.stamp))
            if profiler is not None:
                profiler.disable()
            used = _cpu_s() - before
            print(
                f"round {round_no + 1}: {args.streams} streams × {args.tokens} tokens, stamp {args.stamp}: "
                f"{chunks} chunks, CPU {used * 1e6 / chunks:.1f} µs/chunk"
            )
            if profiler is not None:
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
