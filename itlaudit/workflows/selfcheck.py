"""Runs the real capture path against the ground-truth server: shared by `itlaudit selfcheck`, the
tests and benchmarks/client_fidelity.py, so all three measure the same thing the same way."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from itlaudit.analysis.fidelity import (
    LAG_BUDGET_MS,
    ChunkJoin,
    Fidelity,
    SendLag,
    grade,
    join_chunks,
    send_lag,
)
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.sendlog import SendLog
from itlaudit.serve.launcher import LaunchedServer, launch
from itlaudit.serve.truth import TruthConfig
from itlaudit.side.client import BlockingSideClient

if TYPE_CHECKING:
    from itlaudit.capture.runner import CaptureOptions

# WARN rather than FAIL: the tail is over the bar but each request's token ITL (a mean over its gaps)
# is still this close to the truth, so means and medians stand while tail percentiles carry client lag.
MEAN_ERROR_TOLERANCE = 0.01
MAX_SEARCH_STREAMS = 1024

Trial = Callable[[int], Fidelity]


@contextmanager
def truth_server(config: TruthConfig, log_dir: Path) -> Iterator[LaunchedServer]:
    """The truth server in its own process on a free loopback port, stopped on exit."""
    spec = LaunchSpec(
        kind=LaunchKind.COMMAND,
        command=[
            sys.executable,
            "-m",
            "itlaudit.serve.truth",
            "--port",
            "{port}",
            "--chunks-per-s",
            repr(config.chunks_per_s),
            "--tokens-per-chunk",
            str(config.tokens_per_chunk),
            "--ttft-ms",
            repr(config.ttft_ms),
            "--model",
            config.model,
        ],
        ready_timeout_s=30,
    )
    with launch(spec, log_dir / "truth-server.log") as server:
        yield server


def fetch_send_log(base_url: str) -> SendLog:
    return SendLog.from_json(BlockingSideClient().get_json(f"{base_url}/truth/log"))


def reset_send_log(base_url: str) -> None:
    """Forget earlier trials, so each trial's log holds only its own responses."""
    BlockingSideClient().request("POST", f"{base_url}/truth/reset").checked()


def selfcheck_scenario_toml(base_url: str, streams: int, tokens: int) -> str:
    """Every stream at once, each asking for exactly `tokens` tokens."""
    return (
        'name = "selfcheck"\nendpoint = "completions"\nmodel = "auto"\n\n[workload]\n'
        f'prompts = ["selfcheck"]\nnum_requests = {streams}\nconcurrency = {streams}\n'
        f"max_tokens = {tokens}\nignore_eos = true\ntemperature = 0\n\n"
        f'[[variants]]\nname = "truth"\nurl = "{base_url}"\n'
    )


def run_itlaudit(
    base_url: str, streams: int, tokens: int, run_dir: Path, capture: CaptureOptions | None = None
) -> Path:
    """One `itlaudit run` of `streams` concurrent requests, in-process; returns the run folder."""
    from itlaudit.model.scenario import parse_scenario
    from itlaudit.workflows.run import run_scenario

    scenario = parse_scenario(selfcheck_scenario_toml(base_url, streams, tokens), run_dir / "selfcheck.toml")
    # The progress display `itlaudit run` shows goes to stderr here too: the capture path as users run it.
    console = Console(stderr=True)
    run_scenario(scenario, url=base_url, run_dir=run_dir, console=console, capture=capture)
    return run_dir


def run_trial(
    base_url: str, streams: int, tokens: int, run_dir: Path, capture: CaptureOptions | None = None
) -> tuple[Fidelity, SendLag]:
    """One trial against a running truth server: its log cleared, one run of `streams` requests, graded
    against what the server sent; with the server's own send lag beside it."""
    reset_send_log(base_url)
    run_itlaudit(base_url, streams, tokens, run_dir, capture)
    sent = fetch_send_log(base_url)
    return grade_run(run_dir, sent), send_lag(sent)


def search_streams(
    trial: Trial, start: int = 1, limit: int = MAX_SEARCH_STREAMS
) -> tuple[int, Fidelity | None]:
    """Highest stream count whose trial stays within budget: doubling until one fails, then bisecting.

    Returns (0, None) when even `start` streams fail. Loads are assumed monotone (more streams never
    help), which a noisy machine can violate; the answer is then a lower bound of what it can do.
    """
    good, good_result = 0, None
    n = start
    bad = None
    while n <= limit:
        result = trial(n)
        if not result.within_budget:
            bad = n
            break
        good, good_result = n, result
        n *= 2
    if bad is None:
        return good, good_result
    while bad - good > max(1, good // 8):
        mid = (good + bad) // 2
        result = trial(mid)
        if result.within_budget:
            good, good_result = mid, result
        else:
            bad = mid
    return good, good_result


def grade_run(run_dir: Path, sent: SendLog) -> Fidelity:
    """Join requests.jsonl's raw chunk fields to the send log; ITL as itlaudit itself derives it."""
    from itlaudit.analysis.metrics import request_metrics
    from itlaudit.model.records import RequestRecord
    from itlaudit.store.jsonl import iter_jsonl
    from itlaudit.store.rundir import REQUESTS_FILE

    joins: dict[str, ChunkJoin] = {}
    reported: dict[str, float | None] = {}
    for line in iter_jsonl(run_dir / REQUESTS_FILE):
        record = RequestRecord.from_json(line)
        rid = record.response_id
        if rid is None or rid not in sent.responses:
            continue
        joins[rid] = join_chunks(record.chunks.t_ms, record.chunks.completion_tokens, sent.responses[rid])
        reported[rid] = request_metrics(record).itl_ms
    return grade(joins, reported, sent)


def verdict(fidelity: Fidelity) -> tuple[str, str]:
    """PASS, WARN or FAIL against the bar `--search` uses (LAG_BUDGET_MS of p99 added lag, no chunk
    stamped before its send, every chunk stamped), with what it means for figures taken at this load."""
    bar = f"{LAG_BUDGET_MS:g} ms p99 added-lag bar"
    if fidelity.within_budget:
        return "PASS", f"within the {bar}: figures at this load are the server's, not the client's"
    error = fidelity.worst_itl_error
    if not fidelity.every_chunk_stamped or fidelity.lag_p99_ms is None or fidelity.lag_min_ms is None:
        return "FAIL", "chunks went unstamped: this machine cannot audit this load; try fewer streams"
    if error is not None and error <= MEAN_ERROR_TOLERANCE:
        return "WARN", (
            f"over the {bar} (p99 {fidelity.lag_p99_ms:.3f} ms): token-ITL means hold (worst error "
            f"{error:.2%}), tail percentiles carry client lag; try fewer streams or --search"
        )
    return "FAIL", (
        f"over the {bar} (p99 {fidelity.lag_p99_ms:.3f} ms) and token ITL off by up to "
        f"{'–' if error is None else f'{error:.2%}'}: this machine cannot audit this load; try fewer "
        "streams or --search"
    )
