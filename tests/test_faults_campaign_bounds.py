"""Fault campaign 2026-12-04, rows 26, N11 and N12 (unbounded numbers), end to end: the real CLI in a
fresh interpreter against tests/faultserver.py. Each bad number is one line and exit 2 before any folder
is made; a prompt longer than the server's max_model_len is one line before the prompts are built; a
long preparation shows progress and ends within a second of a Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faultkit import (
    UNREACHABLE,
    itlaudit,
    one_error_line,
    refused_before_any_folder,
    url_variant,
    write_scenario,
)


@pytest.mark.fault_row("26")
@pytest.mark.parametrize(
    ("key", "bound"),
    [("temperature", "[0, 100]"), ("request_timeout_s", "(0, 86400] s")],
)
def test_nan_in_a_scenario_is_refused_with_its_line_and_bound(key: str, bound: str, tmp_path: Path) -> None:
    """Was: temperature = nan dropped (the server's default used), request_timeout_s = nan no limit."""
    workload = f'prompts = ["Tell me about lighthouses."]\nnum_requests = 2\n{key} = nan'
    line = refused_before_any_folder(tmp_path, workload)
    assert f"t.toml:7: `workload.{key}` must be a finite number in {bound}, got nan" in line


@pytest.mark.fault_row("N11")
def test_a_billion_token_random_prompt_is_refused_at_once(tmp_path: Path) -> None:
    """Was: 185 s building the prompt, deaf to SIGINT."""
    workload = (
        'num_requests = 1\n\n[workload.dataset]\nkind = "random"\ninput_len = 1000000000\noutput_len = 8'
    )
    line = refused_before_any_folder(tmp_path, workload)
    assert "`workload.dataset.input_len` must be an integer in [1, 10000000], got 1000000000" in line


@pytest.mark.fault_row("N11")
def test_a_prompt_over_the_servers_max_model_len_is_one_line_before_any_request(
    faultserver: Callable[..., str], tmp_path: Path
) -> None:
    url = faultserver("clean")  # the simulator's /v1/models states max_model_len 2048
    workload = 'num_requests = 2\n\n[workload.dataset]\nkind = "random"\ninput_len = 4096\noutput_len = 8'
    path = write_scenario(tmp_path, url_variant("v", url), workload)
    line = one_error_line(itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path))
    assert "`workload.dataset.input_len` draws prompts of up to 4096 tokens" in line
    assert "takes at most 2048 (max_model_len in /v1/models)" in line
    requests = tmp_path / "run" / "requests.jsonl"
    assert not requests.exists() or requests.stat().st_size == 0  # no request was sent
    # Its neighbour fits and runs.
    fits = workload.replace("4096", "2000")
    path = write_scenario(tmp_path, url_variant("v", url), fits, name="fits")
    result = itlaudit("run", str(path), "--out", str(tmp_path / "fits"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.fault_row("N12")
@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        ("warmup_requests = 100000000000", "`workload.warmup_requests` must be an integer in [0, 1000000]"),
        ("request_rate = 1e-9", "at 1e-09 requests/s spreads 2 requests over ~2e+09 s, more than a day"),
        ("request_rate = 0.001\nduration_s = 60", "sends its first request after ~1e+03 s, past duration_s"),
        ("request_rate = inf", "`workload.request_rate` must be a finite number in (0, 1000000]"),
        (
            "request_rate = 4\nburstiness = 1e-9",
            "`workload.burstiness` must be a finite number in [0.01, 1000]",
        ),
    ],
    ids=["warmup 1e11", "rate 1e-9", "rate past duration", "rate inf", "burstiness 1e-9"],
)
def test_an_absurd_open_loop_is_one_line(arrivals: str, expected: str, tmp_path: Path) -> None:
    """Was: warmup 1e11 a MemoryError traceback; rate 1e-9 idle for ~60 years without a word."""
    line = refused_before_any_folder(
        tmp_path, f'prompts = ["Tell me about lighthouses."]\nnum_requests = 2\n{arrivals}'
    )
    assert expected in line


@pytest.mark.fault_row("N11")
def test_sigint_during_a_long_prompt_build_exits_130_within_a_second_or_two(
    faultserver: Callable[..., str], tmp_path: Path
) -> None:
    """A large, legal workload (200K random prompts) spends seconds encoding its bodies: the log shows
    that step's progress, and a Ctrl-C in it ends the run at once, with no request sent."""
    url = faultserver("clean")
    workload = 'num_requests = 200000\n\n[workload.dataset]\nkind = "random"\ninput_len = 64\noutput_len = 8'
    path = write_scenario(tmp_path, url_variant("v", url), workload)
    process = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "run", str(path), "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "ITLAUDIT_PROGRESS_PERIOD_S": "0.2"},
    )
    lines: list[str] = []
    building = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for text in process.stderr:
            lines.append(text)
            if "encoding requests" in text:
                building.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert building.wait(120), "".join(lines)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        code = process.wait(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(10)
    stderr = "".join(lines)
    assert code == 130, stderr
    assert took < 3.0, f"{took:.1f} s after SIGINT"  # ~0.1 s idle; the bound allows for a loaded box
    assert "Traceback" not in stderr
    assert "SIGINT" in stderr.strip().splitlines()[-1]
    requests = tmp_path / "run" / "requests.jsonl"
    assert not requests.exists() or requests.stat().st_size == 0


# The CLI's own entry point, with a Ctrl-C half a second after it starts (imports take seconds on a
# loaded box, so the delay counts from main(), not from the process start).
_INTERRUPTED_MAIN = """
import os, signal, sys, threading, time
from itlaudit.cli.app import main
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
sys.argv = ["itlaudit", *sys.argv[1:]]
main()
"""


@pytest.mark.fault_row("N11")
def test_sigint_while_a_large_random_dataset_is_drawn_is_one_line_130_and_no_folder(tmp_path: Path) -> None:
    """The largest legal random dataset (20M prompt tokens) takes seconds to draw: a Ctrl-C then ends
    the command at once with one line, before any run folder exists."""
    workload = 'num_requests = 1000\n\n[workload.dataset]\nkind = "random"\ninput_len = 20000\noutput_len = 8'
    path = write_scenario(tmp_path, url_variant("v", UNREACHABLE), workload)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_MAIN, "run", str(path), "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip().splitlines() == ["itlaudit: interrupted by SIGINT"], result.stderr
    assert not (tmp_path / "run").exists()
    assert time.monotonic() - started < 60
