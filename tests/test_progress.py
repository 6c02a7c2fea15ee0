"""Progress without a terminal (a CI log, nohup, a pipe): one line per phase and a heartbeat whenever
nothing was printed for a period, so a log is never silent for long; on a terminal, rich's display.
The period is ITLAUDIT_PROGRESS_PERIOD_S here (10 s by default), so the test need not wait 10 s."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from simkit import itlaudit, sim_server

from itlaudit.report.progress import DEFAULT_PERIOD_S, PERIOD_ENV, Reporter
from itlaudit.serve.sim import SimConfig

HEARTBEAT = re.compile(r"^A @ http://\S+: \d+/8 requests, \d+ tokens/s, elapsed \d+:\d\d, ETA (\?|\d+:\d\d)$")


def test_a_piped_run_prints_phase_lines_and_a_periodic_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PERIOD_ENV, "0.3")
    with sim_server(SimConfig(step_ms=25)) as url:
        result = itlaudit(
            "run", "--url", url, "--num-prompts", "8", "--max-concurrency", "2", "--max-tokens", "40",
            "--variant", f"A={url}", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "" not in lines and "\x1b" not in result.stderr  # plain lines: no blank ones, no escapes
    assert re.match(r"^A: 8 requests to http://\S+ over 1 capture process$", lines[0]), lines
    heartbeats = [line for line in lines if HEARTBEAT.match(line)]
    assert heartbeats, lines  # the capture takes ~2 s: several periods of 0.3 s
    done = [line for line in lines if re.match(r"^A: 8 requests done in \d+:\d\d$", line)]
    assert len(done) == 1 and lines.index(done[0]) > lines.index(heartbeats[-1])
    steps = ["deriving figures…", "drawing the plots and writing the report…"]
    assert [line for line in lines if line in steps] == steps


def test_a_step_without_a_terminal_is_a_line_then_heartbeats_with_the_time_spent() -> None:
    sink = io.StringIO()
    reporter = Reporter(Console(file=sink, width=200), period_s=0.1)
    assert not reporter.live
    with reporter.step("drawing the plots"):
        time.sleep(0.35)
    lines = sink.getvalue().splitlines()
    assert lines[0] == "drawing the plots…"
    assert len(lines) >= 3 and all(re.match(r"^drawing the plots… \(0:00\)$", line) for line in lines[1:])
    count = len(lines)
    time.sleep(0.25)
    assert len(sink.getvalue().splitlines()) == count  # the heartbeat stops with the step


def test_the_default_period_is_10_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PERIOD_ENV, raising=False)
    assert Reporter(Console(file=io.StringIO())).period_s == DEFAULT_PERIOD_S == 10.0
