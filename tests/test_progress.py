"""Progress without a terminal (a CI log, nohup, a pipe): one line per phase and a heartbeat whenever
nothing was printed for a period, so a log is never silent for long; on a terminal, rich's display.
The period is ITLAUDIT_PROGRESS_PERIOD_S here (10 s by default), so the test need not wait 10 s."""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from simkit import itlaudit, sim_server

from itlaudit.report.progress import DEFAULT_PERIOD_S, PERIOD_ENV, CaptureProgress, Reporter
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
    heartbeats = [line for line in lines if HEARTBEAT.match(line)]
    # A loaded machine may take more than one period to start the capture process: heartbeats (0/8)
    # may come first, but the first line that is not one is the phase line.
    phases = [line for line in lines if not HEARTBEAT.match(line)]
    assert re.match(r"^A: 8 requests to http://\S+ over 1 capture process$", phases[0]), lines
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


@pytest.mark.parametrize("thread_ran", [False, True], ids=["before-the-thread-runs", "after-it-runs"])
def test_a_signal_inside_the_heartbeats_start_is_one_clean_exit_and_no_heartbeat_after(
    monkeypatch: pytest.MonkeyPatch, thread_ran: bool
) -> None:
    """A SIGINT/SIGTERM can land inside Thread.start() (it waits for the new thread). The step's way
    out must not meet join()'s "cannot join thread before it is started", and no heartbeat may follow
    the interrupted step; the next step beats again."""
    real_start = threading.Thread.start

    def interrupted_start(thread: threading.Thread) -> None:
        if thread_ran:
            real_start(thread)
        raise KeyboardInterrupt

    sink = io.StringIO()
    reporter = Reporter(Console(file=sink, width=200), period_s=0.05)
    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt), reporter.step("drawing the plots"):
        pass
    monkeypatch.undo()
    time.sleep(0.2)
    assert sink.getvalue().splitlines() == ["drawing the plots…"]
    with reporter.step("writing the report"):
        time.sleep(0.2)
    assert sink.getvalue().splitlines()[1:3] == ["writing the report…", "writing the report… (0:00)"]


def test_the_default_period_is_10_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PERIOD_ENV, raising=False)
    assert Reporter(Console(file=io.StringIO())).period_s == DEFAULT_PERIOD_S == 10.0


def test_on_a_terminal_the_capture_is_a_bar_with_tokens_per_s_and_eta_and_a_step_is_a_spinner() -> None:
    sink = io.StringIO()
    reporter = Reporter(Console(file=sink, force_terminal=True, width=150), period_s=0.1)
    assert reporter.live
    with reporter.capture("requests", 4) as counts:
        counts.begin("K0 @ http://127.0.0.1:8000")
        counts.landed()
        counts.add_tokens(512)
        deadline = time.monotonic() + 10  # the bar's refresh (every 0.5 s) reads the counters
        while "1/4" not in sink.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        with reporter.step("K3: starting its server"):
            assert counts.description == "K3: starting its server…"  # the bar names the step
        assert counts.description == "K0 @ http://127.0.0.1:8000"
    with reporter.step("drawing the plots"):
        time.sleep(0.2)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sink.getvalue())  # the terminal's codes out
    assert re.search(r"K0 @ http://127\.0\.0\.1:8000 \S+ 1/4 \d+ tok/s 0:00:\d\d ETA", text), text
    assert "drawing the plots…" in text


def test_each_variant_counts_its_own_requests_and_its_eta_starts_when_it_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two variants of 4 requests: every heartbeat says n/4 of the variant it names, never n/8 (the
    run's total), and B's count starts from 0 (issue 36 item 4). ~3 s."""
    monkeypatch.setenv(PERIOD_ENV, "0.2")
    with sim_server(SimConfig(step_ms=20)) as url:
        result = itlaudit(
            "run", "--num-prompts", "4", "--max-concurrency", "1", "--max-tokens", "16",
            "--variant", f"A={url}", "--variant", f"B={url}", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    beats = [m.groups() for m in re.finditer(r"^([AB]) @ \S+: (\d+)/(\d+) requests", result.stderr, re.M)]
    assert {total for _, _, total in beats} == {"4"}, result.stderr
    assert any(name == "B" for name, _, _ in beats), result.stderr
    counts = CaptureProgress("x", 8)
    counts.landed()
    counts.begin("B @ u", 4)
    assert (counts.done, counts.total, counts.eta()) == (0, 4, "?")
