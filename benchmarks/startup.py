"""Fixed costs a user feels, timed as whole processes (issue 24 item 6): `itlaudit --help`, and a run of
N one-second requests against the simulator end to end, paired in the same rounds with a naive client
(one process, aiohttp, the same workload), so the difference is itlaudit's own overhead.

Each round runs, in turn: `python -c pass` (the interpreter's floor), `itlaudit --help` (the command
list: no command imported), `itlaudit run --help` (run's options: its module and what it imports), the
naive client, `itlaudit run --no-plots` and `itlaudit run` (report with plots), each a fresh process; the
figures are the median over the rounds (min beside it). Each run's report writing, as the run itself timed
it (meta.json `finish_s`), is taken off its wall time for the figure the issue's target is on: the fixed
overhead besides report writing. The simulator is one process of its own, started
once (`itlaudit sim`, --step-ms 10, so --tokens 100 is one second per request at any concurrency).
Besides the wall times it prints what moves less with the machine's load: how many modules importing
itlaudit.cli.app (the entry and its table) and itlaudit.cli.run (the run command) load, and their
cumulative import time (`python -X importtime`).

    .venv/bin/python benchmarks/startup.py --streams 64 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from itlaudit.serve.launcher import LaunchSpec, launch

PROMPT = "Tell me a long story about a dog who learns to sail."
STEP_MS = 10.0
SERVED = "startup-sim"  # the simulator's one model, named by both clients
BIN = Path(sys.executable).parent


def _itlaudit() -> list[str]:
    """The console script the user runs (its own start-up included), else `python -m itlaudit`."""
    script = BIN / "itlaudit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "itlaudit"]


def _wall(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... exited {done.returncode}:\n{done.stderr[-2000:]}")
    return took


def import_figures(module: str) -> tuple[int, float]:
    """Modules loaded by `import MODULE` and its cumulative import time (s)."""
    code = f"import {module}, sys; print(len(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    line = next(x for x in done.stderr.splitlines() if x.rstrip().endswith(f"| {module}"))
    return int(done.stdout.split()[-1]), int(line.split("|")[1]) / 1e6


async def _naive(url: str, streams: int, tokens: int) -> int:
    """What a hand-written client does: N streaming completions at once, lines read until [DONE]."""
    import aiohttp

    body = {"model": SERVED, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}

    async def one(session: aiohttp.ClientSession) -> int:
        chunks = 0
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.content:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    chunks += 1
        return chunks

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        counts = await asyncio.gather(*(one(session) for _ in range(streams)))
    return sum(counts)


def _scenario(path: Path, url: str, streams: int, tokens: int) -> Path:
    path.write_text(
        f'name = "startup"\nendpoint = "completions"\n\n[workload]\nprompts = ["{PROMPT}"]\n'
        f"num_requests = {streams}\nconcurrency = {streams}\nmax_tokens = {tokens}\ntemperature = 0\n\n"
        f'[[variants]]\nname = "A"\nurl = "{url}"\n',
        encoding="utf-8",
    )
    return path


def _summary(name: str, times: list[float]) -> str:
    return f"{name:<28} median {statistics.median(times):6.3f} s   min {min(times):6.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16, help="Concurrent requests (default 16).")
    parser.add_argument("--tokens", type=int, default=100, help="Tokens per request (x 10 ms; default 100).")
    parser.add_argument("--rounds", type=int, default=3, help="Paired rounds (default 3).")
    parser.add_argument("--naive", metavar="URL", help=argparse.SUPPRESS)  # the naive client's own process
    args = parser.parse_args()
    if args.naive:
        chunks = asyncio.run(_naive(args.naive, args.streams, args.tokens))
        if chunks < args.streams * args.tokens:  # a short answer would make the naive client look fast
            raise SystemExit(f"naive client: {chunks} chunks for {args.streams} x {args.tokens} tokens")
        print(chunks)
        return

    for module in ("itlaudit.cli.app", "itlaudit.cli.run"):
        count, import_s = import_figures(module)
        print(f"import {module}: {count} modules, {import_s:.3f} s cumulative (-X importtime)")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="itlaudit-startup-") as scratch:
        root = Path(scratch)
        spec = LaunchSpec(
            kind="command",
            command=[*_itlaudit(), "sim", "--port", "{port}", "--step-ms", str(STEP_MS), "--model", SERVED],
            ready_timeout_s=60,
        )
        server = launch(spec, root / "sim.log")
        try:
            scenario = _scenario(root / "startup.toml", server.url, args.streams, args.tokens)
            ledger = ["--ledger", str(root / "ledger.jsonl")]
            runs: dict[str, Callable[[int], list[str]]] = {
                "python -c pass": lambda i: [sys.executable, "-c", "pass"],
                "itlaudit --help": lambda i: [*_itlaudit(), "--help"],
                "itlaudit run --help": lambda i: [*_itlaudit(), "run", "--help"],
                "naive client (aiohttp)": lambda i: [
                    sys.executable,
                    __file__,
                    "--naive",
                    server.url,
                    "--streams",
                    str(args.streams),
                    "--tokens",
                    str(args.tokens),
                ],
                "itlaudit run --no-plots": lambda i: [
                    *_itlaudit(),
                    "run",
                    str(scenario),
                    "--out",
                    str(root / f"np{i}"),
                    *ledger,
                    "--no-plots",
                ],
                "itlaudit run": lambda i: [
                    *_itlaudit(),
                    "run",
                    str(scenario),
                    "--out",
                    str(root / f"p{i}"),
                    *ledger,
                ],
            }
            times: dict[str, list[float]] = {name: [] for name in runs}
            # Each run's own account of its report writing (meta.json `finish_s`: deriving summary.json,
            # the CSVs and report.md; with plots, drawing them and report.html), read per round.
            writing: dict[str, list[float]] = {"itlaudit run --no-plots": [], "itlaudit run": []}
            for i in range(args.rounds):
                for name, argv in runs.items():
                    times[name].append(_wall(argv(i), root))
                for name, folder in (("itlaudit run --no-plots", f"np{i}"), ("itlaudit run", f"p{i}")):
                    finish = json.loads((root / folder / "meta.json").read_text())["finish_s"]
                    writing[name].append(sum(finish.values()))
        finally:
            server.stop()
    ideal = args.tokens * STEP_MS / 1000
    print(
        f"workload: {args.streams} streams x {args.tokens} tokens at {STEP_MS:g} ms/step ({ideal:g} s each)"
    )
    for name, values in times.items():
        print(_summary(name, values))
    naive = statistics.median(times["naive client (aiohttp)"])
    for name in ("itlaudit run --no-plots", "itlaudit run"):
        run = statistics.median(times[name])
        print(f"{name}: {run / naive:.2f}x the naive client, +{run - naive:.2f} s fixed overhead")
    # The target is on the fixed overhead besides report writing: per round, the run's wall time
    # less its own report writing, against the same round's naive client.
    for name, spent in writing.items():
        rest = [
            run - w - n for run, w, n in zip(times[name], spent, times["naive client (aiohttp)"], strict=True)
        ]
        print(
            f"{name}: report writing median {statistics.median(spent):.2f} s (meta.json finish_s); "
            f"fixed overhead besides it median +{statistics.median(rest):.2f} s (max +{max(rest):.2f} s)"
        )
    print(
        json.dumps(
            {
                name: [round(t, 3) for t in values]
                for name, values in {**times, **{f"{k} writing": v for k, v in writing.items()}}.items()
            }
        )
    )


if __name__ == "__main__":
    main()
