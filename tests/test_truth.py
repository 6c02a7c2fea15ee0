"""The ground-truth server keeps its word (complete send log, small own lag, vLLM's wire format), the
simulator keeps absolute time, and the capture path is graded against the truth at 8 streams."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from itlaudit.analysis.fidelity import send_lag
from itlaudit.analysis.metrics import request_metrics
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.records import RequestRecord
from itlaudit.model.sendlog import SendLog
from itlaudit.serve.launcher import LaunchedServer, launch
from itlaudit.serve.truth import TruthConfig
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.workflows.selfcheck import fetch_send_log, grade_run, reset_send_log, run_itlaudit, truth_server

BODY = {
    "model": "truth",
    "prompt": "hi",
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    "return_token_ids": True,
}


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    with truth_server(TruthConfig(chunks_per_s=500.0), tmp_path_factory.mktemp("truth")) as server:
        yield server


async def _stream(url: str, max_tokens: int, request_id: str) -> list[dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/completions",
            json={**BODY, "max_tokens": max_tokens},
            headers={"X-Request-Id": request_id},
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        text = (await resp.read()).decode()
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_send_log_is_complete_and_the_server_keeps_its_schedule(truth: LaunchedServer) -> None:
    reset_send_log(truth.url)

    async def four() -> list[list[dict]]:
        return await asyncio.gather(*(_stream(truth.url, 200, f"t{i}") for i in range(4)))

    streams = asyncio.run(four())
    log = fetch_send_log(truth.url)
    assert sorted(log.responses) == [f"cmpl-t{i}" for i in range(4)]
    for chunks, rid in zip(streams, sorted(log.responses), strict=True):
        sends = log.responses[rid]
        assert sends.tokens == list(range(1, 201))
        assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == sends.tokens
        assert all(c["id"] == rid for c in chunks)
        # One timer, one grid: every chunk of every stream is due on a tick of the 2 ms clock grid.
        assert all(d % 2_000_000 == 0 for d in sends.due_ns)
        assert all(b - a == 2_000_000 for a, b in zip(sends.due_ns, sends.due_ns[1:], strict=False))
        assert all(s >= d for s, d in zip(sends.sent_ns, sends.due_ns, strict=True))
    lag = send_lag(log)
    assert lag.chunks == 800
    # Its own lag behind schedule is what the stick bends by. Typically p50 0.14 / p99 0.3-2.1 ms here:
    # the p99 is one missed 2 ms tick when the VM's host is busy, so the tail bound is loose; a server
    # that drifted (sleeping after each send) would move the median, which is held tight.
    assert lag.p50_ms is not None and lag.p50_ms < 1.0, lag
    assert lag.p99_ms is not None and lag.p99_ms < 10.0, lag
    assert log.server["buffered_writes"] == 0


def test_wire_format_is_the_simulators(truth: LaunchedServer) -> None:
    from itlaudit.serve.sim import SimConfig, run_sim

    async def both() -> tuple[list[dict], list[dict]]:
        truth_chunks = await _stream(truth.url, 3, "w")
        async with run_sim(SimConfig(model="truth", step_ms=1, ttft_ms=0)) as sim_url:
            sim_chunks = await _stream(sim_url, 3, "w")
        return truth_chunks, sim_chunks

    truth_chunks, sim_chunks = asyncio.run(both())
    assert len(truth_chunks) == len(sim_chunks) == 4  # three content chunks, then usage only
    for ours, theirs in zip(truth_chunks, sim_chunks, strict=True):
        assert list(ours) == list(theirs)
        assert [list(c) for c in ours["choices"]] == [list(c) for c in theirs["choices"]]
        assert ours["usage"] == theirs["usage"]
    assert truth_chunks[2]["choices"][0]["finish_reason"] == "length"


def test_tokens_per_chunk_and_bad_requests(tmp_path: Path) -> None:
    with truth_server(TruthConfig(chunks_per_s=1000.0, tokens_per_chunk=3), tmp_path) as server:
        chunks = asyncio.run(_stream(server.url, 10, "k3"))
        assert [c["usage"]["completion_tokens"] for c in chunks] == [3, 6, 9, 10, 10]
        assert [len(c["choices"][0]["token_ids"]) for c in chunks[:-1]] == [3, 3, 3, 1]

        async def rejected() -> tuple[int, dict]:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{server.url}/v1/completions", json={"prompt": "x", "stream": False}) as resp,
            ):
                return resp.status, await resp.json()

        status, body = asyncio.run(rejected())
        assert status == 400 and body["error"]["param"] == "stream"


def _sim_with_send_log(tmp_path: Path, step_ms: float) -> tuple[LaunchedServer, Path]:
    log_path = tmp_path / "sim-sends.json"
    spec = LaunchSpec(
        kind="command",
        command=[
            sys.executable,
            "-m",
            "itlaudit",
            "sim",
            "--port",
            "{port}",
            "--step-ms",
            str(step_ms),
            "--send-log",
            str(log_path),
        ],
        ready_timeout_s=30,
    )
    return launch(spec, tmp_path / "sim.log"), log_path


def test_sim_keeps_absolute_step_times(tmp_path: Path) -> None:
    """Sleeping step_ms after each send drifted by the write and wake-up time (~11.7 ms per "10 ms");
    deadlines on the monotonic clock do not, so the measured token ITL is the configured step."""
    server, log_path = _sim_with_send_log(tmp_path, 5.0)
    with server:
        run_dir = run_itlaudit(server.url, 1, 200, tmp_path / "run")
    lines = list(iter_jsonl(run_dir / "requests.jsonl"))
    assert len(lines) == 1
    itl = request_metrics(RequestRecord.from_json(lines[0])).itl_ms
    assert itl == pytest.approx(5.0, rel=0.02)
    log = SendLog.load(log_path)
    sends = log.responses[lines[0]["response_id"]]
    assert sends.tokens == list(range(1, 201))
    gaps = [b - a for a, b in zip(sends.due_ns, sends.due_ns[1:], strict=False)]
    # On the absolute schedule, except while catching up after a stall (half a step apart, no burst).
    assert min(gaps) >= 2_500_000
    assert sorted(gaps)[len(gaps) // 2] == 5_000_000  # due times on the grid (sleep-after-send drifts)
    assert log.server["kind"] == "sim"


def test_a_64_stream_run_against_the_sim_reports_its_schedule_within_1_percent(tmp_path: Path) -> None:
    """Issue 13's "done when": every request's token ITL within 1 % of the simulator's 10 ms step (and of
    the steps it actually sent). Measured idle: worst +0.16 % against the schedule, +0.01 % against the
    sends."""
    server, log_path = _sim_with_send_log(tmp_path, 10.0)
    with server:
        run_dir = run_itlaudit(server.url, 64, 100, tmp_path / "run")
    log = SendLog.load(log_path)
    lines = list(iter_jsonl(run_dir / "requests.jsonl"))
    assert len(lines) == 64
    for line in lines:
        itl = request_metrics(RequestRecord.from_json(line)).itl_ms
        sends = log.responses[line["response_id"]]
        sent_itl = (sends.sent_ns[-1] - sends.sent_ns[0]) / 1e6 / (sends.tokens[-1] - sends.tokens[0])
        assert itl == pytest.approx(sent_itl, rel=0.01)
        assert itl == pytest.approx(10.0, rel=0.01)


def test_capture_path_against_the_truth_at_8_streams(truth: LaunchedServer, tmp_path: Path) -> None:
    reset_send_log(truth.url)
    run_dir = run_itlaudit(truth.url, 8, 500, tmp_path / "run")
    sent = fetch_send_log(truth.url)
    result = grade_run(run_dir, sent)
    assert result.responses == 8
    assert result.every_chunk_stamped, result
    assert result.worst_itl_error is not None and result.worst_itl_error <= 0.03, result


def test_selfcheck_cli_prints_the_grade(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "itlaudit",
            "selfcheck",
            "--streams",
            "2",
            "--tokens",
            "50",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "2 streams × 500 chunks/s × 1 token/chunk: added lag min" in result.stdout.replace("\n", " ")
    assert "over 100 chunks" in result.stdout.replace("\n", " ")
    # The verdict against --search's bar, last: PASS, WARN or FAIL with what it means.
    assert re.match(r"(PASS|WARN|FAIL): .*1 ms p99 added-lag bar", result.stdout.strip().splitlines()[-1])
    assert (tmp_path / "run-01-2streams" / "requests.jsonl").is_file()


async def test_a_starved_sim_catches_up_without_bursting() -> None:
    from itlaudit.serve.sim import SimConfig, run_sim

    log = SendLog()
    async with run_sim(SimConfig(model="truth", step_ms=5, ttft_ms=0), send_log=log) as url:
        asyncio.get_running_loop().call_later(0.05, time.sleep, 0.03)  # starve the loop for 6 steps
        await _stream(url, 40, "starved")
    sends = log.responses["cmpl-starved"]
    due_gaps = np.diff(sends.due_ns)
    sent_gaps = np.diff(sends.sent_ns) / 1e6
    assert due_gaps.min() >= 2_500_000  # catching up at half a step apart ...
    assert sends.due_ns[-1] - sends.due_ns[0] == 39 * 5_000_000  # ... back on the absolute schedule
    # The six missed steps were not sent back to back (one short gap is ordinary jitter).
    assert (sent_gaps < 1.0).sum() <= 1, sent_gaps
