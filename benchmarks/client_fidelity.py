"""Client fidelity: itlaudit vs a naive aiohttp readline client vs vLLM's own benchmark client, graded
against the ground-truth SSE server's send log (issue 13).

Every client runs in its own process against ONE truth server (its own process, real-time priority
where allowed), loads and clients interleaved in one run so that a noisy machine hurts them alike.
Per trial: added lag p50/p99/max over every chunk (arrival − first arrival − the same for send times),
the worst per-request token-ITL error vs the truth, and the client's CPU per chunk: its whole process
tree's scheduler run time (/proc/*/task/*/schedstat, ns; exited workers keep their last sample) over the
streaming window, i.e. from the first chunk sent until the last one could have been stamped (last send +
that trial's max lag).

    .venv/bin/python benchmarks/client_fidelity.py            # 1,16,64,128 streams × 500 chunks/s, 3 rounds
    .venv/bin/python benchmarks/client_fidelity.py --quick    # one round of 200 tokens: about a minute
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from itlaudit.capture.runner import CaptureOptions

from itlaudit.analysis.fidelity import (
    LAG_BUDGET_MS,
    ChunkJoin,
    Fidelity,
    grade,
    join_chunks,
    send_lag,
    token_itl_ms,
)
from itlaudit.cli.options import build_capture
from itlaudit.model.sendlog import SendLog
from itlaudit.model.vocabulary import DEFAULT_STAMP, StampMode
from itlaudit.serve.testbed import default_cache_dir
from itlaudit.serve.truth import TruthConfig
from itlaudit.workflows.selfcheck import (
    fetch_send_log,
    grade_run,
    reset_send_log,
    run_itlaudit,
    truth_server,
)

CLIENTS = ("itlaudit", "naive", "vllm")
# A trial grades the client only while the truth server keeps its own schedule. Past its capacity (one
# Python process: ~130k chunks/s on the H200 host's cores) it falls behind and then writes whole tails
# at once: at 1024 streams × 500 chunks/s it ran 1.1–1.6 s late (send lag p50 1.2 s) and sent a 1 s
# stream in 88 ms, so a client read ~12 ms after a burst's write counted as a 13.9% token-ITL error
# against an 88 ms span. Such a trial measures the server, and the table says so instead of grading.
SERVER_LAG_BUDGET_MS = 10.0
HERE = Path(__file__).resolve().parent
CPU_SAMPLE_S = 0.01


# -- the naive client: what a careful person writes in 40 lines --------------------------------------


async def naive_client(url: str, streams: int, tokens: int, prefix: str) -> dict[str, dict[str, list]]:
    import aiohttp

    body = {
        "model": "truth",
        "prompt": "naive client",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }

    async def one(session: aiohttp.ClientSession, request_id: str) -> tuple[str, dict[str, list]]:
        t_ms: list[float] = []
        counts: list[int | None] = []
        t0 = time.monotonic_ns()
        async with session.post(
            f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id}
        ) as resp:
            async for line in resp.content:  # StreamReader iterates by line
                now = time.monotonic_ns()
                if line.startswith(b"data: {"):
                    usage = json.loads(line[6:]).get("usage") or {}
                    t_ms.append((now - t0) / 1e6)
                    counts.append(usage.get("completion_tokens"))
        return f"cmpl-{request_id}", {"t_ms": t_ms, "tokens": counts}

    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        done = await asyncio.gather(*(one(session, f"{prefix}-{i}") for i in range(streams)))
    return dict(done)


# -- one trial: a client process against the truth server, its CPU sampled from outside ----------------


class _TreeCpu:
    """Scheduler run time of a process, its threads and its descendants (itlaudit's capture workers), in
    ns, as a total that never falls.

    /proc/<tid>/schedstat counts one live thread; when a thread or process exits, its time leaves the tree
    (it goes into the parent's cutime only, and only once reaped - the workers are children of the
    multiprocessing forkserver, which reaps them, but that sum is not in any schedstat). Summing the live
    tree alone therefore drops by every worker's whole CPU when the workers exit, which made the per-chunk
    figure negative. So every thread ever seen keeps its last sampled time: an exited thread loses only
    what it ran after its last sample (< one sample interval, and after the streaming window, since the
    workers exit after their streams). rusage from wait4 would count everything, reaped descendants
    included, but only over the whole life of the client (imports, start-up, writing) - not the window.
    """

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._last: dict[int, int] = {}  # thread id -> its last sampled run time
        self._retired = 0  # run time of earlier threads whose ids were reused

    def sample(self) -> int:
        stack = [self._pid]
        last = self._last
        while stack:
            proc = stack.pop()
            try:
                tids = os.listdir(f"/proc/{proc}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{proc}/task/{tid}/schedstat") as f:
                        run_ns = int(f.read().split()[0])
                    with open(f"/proc/{proc}/task/{tid}/children") as f:
                        stack += [int(c) for c in f.read().split()]
                except (OSError, ValueError):
                    continue
                key = int(tid)
                previous = last.get(key, 0)
                if run_ns < previous:  # a new thread under a reused id
                    self._retired += previous
                last[key] = run_ns
        return self._retired + sum(last.values())


def _run_sampled(argv: list[str]) -> tuple[np.ndarray, np.ndarray, float]:
    """Run a client to completion; (monotonic ns, cumulative CPU ns) sampled every 10 ms meanwhile, and
    the process's wall time from start to exit (its start-up and writing included)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree = _TreeCpu(proc.pid)
    times, cpu = [], []
    while proc.poll() is None:
        times.append(time.monotonic_ns())
        cpu.append(tree.sample())
        time.sleep(CPU_SAMPLE_S)
    wall_s = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"client {' '.join(argv[:3])} failed (exit {proc.returncode}):\n{stderr[-2000:]}")
    return np.asarray(times, dtype=float), np.asarray(cpu, dtype=float), wall_s


@dataclass
class TrialResult:
    client: str
    streams: int
    round: int
    fidelity: Fidelity
    cpu_us_per_chunk: float | None
    server_lag_p99_ms: float | None
    server_lag_max_ms: float | None
    # the client process, start to exit (10 ms resolution: the CPU sampler's period); None in trials
    # recorded before the benchmark timed it (tests/fixtures read them)
    wall_s: float | None = None


def _grade_arrivals(result: dict[str, Any], sent: SendLog) -> Fidelity:
    """Naive and vLLM clients: their own arrival series; ITL as each would report it (token-true).

    vLLM's client keeps no token counts, so its k-th choice chunk is the k-th content chunk sent.
    """
    for rid in result.get("warmup", []):
        sent.responses.pop(rid, None)
    joins: dict[str, ChunkJoin] = {}
    reported: dict[str, float | None] = {}
    for rid, series in result["responses"].items():
        sends = sent.responses.get(rid)
        if sends is None:
            continue
        tokens = series.get("tokens") or sends.tokens[: len(series["t_ms"])]
        joins[rid] = join = join_chunks(series["t_ms"], tokens, sends)
        reported[rid] = token_itl_ms(join.arrival_ms, join.tokens)
    return grade(joins, reported, sent)


def trial(
    client: str, url: str, streams: int, tokens: int, round_no: int, work: Path, args: argparse.Namespace
) -> TrialResult:
    prefix = f"{client}-r{round_no}-s{streams}"
    out = work / prefix
    reset_send_log(url)
    common = [url, str(streams), str(tokens), prefix, str(out)]
    if client == "vllm":
        argv = [args.vllm_python, str(HERE / "vllm_client.py"), *common]
    else:
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", client, *common]
        argv += [f"--workers={args.workers}"] * (args.workers is not None)
        argv += [f"--stamp={args.stamp}"] * (args.stamp is not None)
        argv += ["--no-server-metrics"] * args.no_server_metrics
    times, cpu, wall_s = _run_sampled(argv)
    sent = fetch_send_log(url)
    if client == "itlaudit":
        fidelity = grade_run(out, sent)
    else:
        fidelity = _grade_arrivals(json.loads(out.read_text()), sent)
    cpu_per_chunk = None
    if sent.responses and fidelity.chunks and len(times) > 1:
        start = min(s.sent_ns[0] for s in sent.responses.values())
        end = max(s.sent_ns[-1] for s in sent.responses.values())
        end += max(fidelity.lag_max_ms or 0.0, 0.0) * 1e6 + 10e6
        used = np.interp(end, times, cpu) - np.interp(start, times, cpu)
        cpu_per_chunk = used / 1e3 / fidelity.chunks
    lag = send_lag(sent)
    return TrialResult(client, streams, round_no, fidelity, cpu_per_chunk, lag.p99_ms, lag.max_ms, wall_s)


# -- the table -----------------------------------------------------------------------------------------


def server_bound(result: TrialResult) -> bool:
    """The truth server missed its schedule in this trial: its arrivals grade the server, not the client."""
    return result.server_lag_p99_ms is not None and result.server_lag_p99_ms > SERVER_LAG_BUDGET_MS


def _f(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def table(results: list[TrialResult], loads: list[int], clients: list[str], rate: float) -> str:
    lines = [
        "| streams | client | added lag min | p50 | p99 (median [range]) | max | worst token-ITL error "
        "| CPU µs/chunk | unstamped chunks | server send lag p99 / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    p99s: dict[tuple[str, int], float | None] = {}
    bound: list[str] = []
    for streams in loads:
        for client in clients:
            rows = [r for r in results if r.client == client and r.streams == streams]
            if not rows:
                continue
            late = [r for r in rows if server_bound(r)]
            if late:
                bound.append(f"{streams} streams ({client}, {len(late)} of {len(rows)} trials)")
                rows = [r for r in rows if not server_bound(r)]
            if not rows:
                lines.append(f"| {streams} | {client} | server-bound: not graded |" + " |" * 7)
                continue
            fid = [r.fidelity for r in rows]
            p99 = [f.lag_p99_ms for f in fid if f.lag_p99_ms is not None]
            kept = all(f.every_chunk_stamped and (f.lag_min_ms or 0.0) >= -LAG_BUDGET_MS for f in fid)
            p99s[client, streams] = _median(p99) if kept else None
            errors = [f.worst_itl_error for f in fid if f.worst_itl_error is not None]
            lines.append(
                f"| {streams} | {client} | {_f(min((f.lag_min_ms or 0.0 for f in fid), default=None))} ms "
                f"| {_f(_median([f.lag_p50_ms for f in fid]))} ms "
                f"| {_f(_median(p99))} [{_f(min(p99, default=None))}–{_f(max(p99, default=None))}] ms "
                f"| {_f(max((f.lag_max_ms or 0.0 for f in fid), default=None), '.1f')} ms "
                f"| {_f(max(errors, default=None), '.2%')} "
                f"| {_f(_median([r.cpu_us_per_chunk for r in rows]), '.1f')} "
                f"| {sum(f.missing_chunks for f in fid)} "
                f"| {_f(max((r.server_lag_p99_ms or 0.0 for r in rows), default=None))} / "
                f"{_f(max((r.server_lag_max_ms or 0.0 for r in rows), default=None))} ms |"
            )
    lines.append("")
    if bound:
        lines.append(
            f"server-bound, left out of the rows above: the truth server's send lag p99 exceeded "
            f"{SERVER_LAG_BUDGET_MS:g} ms (it fell behind its schedule and burst): " + "; ".join(bound)
        )
    if "itlaudit" in clients and "naive" in clients:
        ratios = []
        for streams in loads:
            ours = _median(
                [
                    r.fidelity.lag_p99_ms
                    for r in results
                    if r.client == "itlaudit" and r.streams == streams and not server_bound(r)
                ]
            )
            naive = _median(
                [
                    r.fidelity.lag_p99_ms
                    for r in results
                    if r.client == "naive" and r.streams == streams and not server_bound(r)
                ]
            )
            ratio = None if ours is None or not naive else ours / naive
            ratios.append(f"{streams} streams {_f(ratio)}×")
        lines.append("itlaudit p99 / naive p99 (target ≤ 0.33): " + ", ".join(ratios))
    for client in clients:
        kept = [s for s in loads if (p := p99s.get((client, s))) is not None and p <= LAG_BUDGET_MS]
        best = max(kept, default=None)
        tested = " (the highest load tested)" if best == max(loads) else ""
        lines.append(
            f"{client}: highest chunk rate with added lag within ±{LAG_BUDGET_MS:g} ms (p99, min) "
            "and every chunk stamped: "
            + (f"{best * rate:g} chunks/s{tested}" if best else "none of the loads tested")
        )
    return "\n".join(lines)


def _csv_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _capture_options(args: argparse.Namespace) -> CaptureOptions:
    """The itlaudit client's capture options, through the command line's one builder (run checks
    them the same way)."""
    from itlaudit.telemetry.window import Telemetry

    return build_capture(
        workers=args.workers or "auto",
        stamp=args.stamp or DEFAULT_STAMP,
        telemetry=Telemetry.from_flags(no_server_metrics=args.no_server_metrics),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=_csv_ints, default=[1, 16, 64, 128], help="loads, e.g. 1,16,64")
    parser.add_argument("--chunks-per-s", type=float, default=500.0, help="per stream")
    parser.add_argument("--tokens", type=int, default=500, help="tokens per request (1 token per chunk)")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of every load × client")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="subset of itlaudit,naive,vllm")
    parser.add_argument("--quick", action="store_true", help="one round of 200-token requests (~1 minute)")
    parser.add_argument(
        "--vllm-python",
        default=str(default_cache_dir() / "testbed" / "vllm-0.32.0" / "bin" / "python"),
        help="interpreter with vLLM installed (the testbed venv)",
    )
    parser.add_argument("--workers", help="itlaudit capture path's --workers, if it has one")
    parser.add_argument("--stamp", type=StampMode, help="itlaudit capture path's --stamp, if it has one")
    parser.add_argument(
        "--no-server-metrics", action="store_true", help="itlaudit without its /metrics sampler (default: on)"
    )
    parser.add_argument("--json", type=Path, help="also write every trial's figures here")
    parser.add_argument("--client", choices=["itlaudit", "naive"], help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()

    if args.client is not None:  # a child process: one client, one trial
        url, streams, tokens, prefix, out = rest
        if args.client == "naive":
            data = asyncio.run(naive_client(url, int(streams), int(tokens), prefix))
            Path(out).write_text(json.dumps({"responses": data}))
        else:
            run_itlaudit(url, int(streams), int(tokens), Path(out), _capture_options(args))
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.quick:
        args.tokens, args.rounds = 200, 1
    clients = [c for c in args.clients.split(",") if c]
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        parser.error(f"--clients: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CLIENTS)}")
    if "vllm" in clients and not Path(args.vllm_python).exists():
        parser.error(f"--vllm-python {args.vllm_python} does not exist; install the testbed or drop vllm")
    _capture_options(args)  # bad flags: one line before any server starts

    results: list[TrialResult] = []
    config = TruthConfig(chunks_per_s=args.chunks_per_s, tokens_per_chunk=1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="client-fidelity-") as scratch:
        work = Path(scratch)
        with truth_server(config, work) as server:
            for round_no in range(args.rounds):
                for load_no, streams in enumerate(args.streams):
                    shift = (round_no + load_no) % len(clients)
                    for client in clients[shift:] + clients[:shift]:
                        result = trial(client, server.url, streams, args.tokens, round_no, work, args)
                        results.append(result)
                        f = result.fidelity
                        print(
                            f"round {round_no} {streams:>4} streams {client:>8}: added lag min "
                            f"{_f(f.lag_min_ms)} p99 {_f(f.lag_p99_ms)} max {_f(f.lag_max_ms, '.1f')} ms, "
                            f"worst ITL error {_f(f.worst_itl_error, '.2%')}, "
                            f"CPU {_f(result.cpu_us_per_chunk, '.1f')} µs/chunk, "
                            f"wall {_f(result.wall_s, '.1f')} s"
                            + (
                                f" (server-bound: send lag p99 {result.server_lag_p99_ms:.0f} ms)"
                                if server_bound(result)
                                else ""
                            ),
                            flush=True,
                        )
    print(
        f"\n{len(results)} trials in {time.monotonic() - started:.0f} s; {args.chunks_per_s:g} chunks/s per "
        f"stream, {args.tokens} tokens per request, 1 token per chunk, {os.cpu_count()} CPUs, "
        f"load average before the end {os.getloadavg()[0]:.2f}\n"
    )
    print(table(results, args.streams, clients, args.chunks_per_s))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))


if __name__ == "__main__":
    main()
