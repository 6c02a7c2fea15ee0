"""What a user's terminal gets on the way out (fault rows N33, N34): `itlaudit sim` on a busy port is one
line and exit 2, not a traceback; and no error or interrupt line is preceded by an empty one (eebc8a8
wrote "\\nitlaudit: error: …": a rich progress display stopped on a pipe left a newline behind)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from faultkit import itlaudit, one_error_line, url_variant, write_scenario

from itlaudit.serve.launcher import free_port


@pytest.mark.fault_row("N33")
def test_sim_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = itlaudit("sim", "--port", str(port), cwd=tmp_path, timeout=60)
    line = one_error_line(result)
    assert line == (
        f"itlaudit: error: sim cannot listen on 127.0.0.1:{port}: Address already in use; "
        "give a free --port (or another --host)"
    )


@pytest.mark.fault_row("N33")
def test_sim_on_a_free_port_serves_and_a_ctrl_c_ends_it_quietly(tmp_path: Path) -> None:
    port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "sim", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                    assert answer.status == 200
                break
            except OSError:
                assert sim.poll() is None and time.monotonic() < deadline, sim.communicate()
                time.sleep(0.1)
        sim.send_signal(signal.SIGINT)
        _, stderr = sim.communicate(timeout=30)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    assert sim.returncode == 0 and stderr == ""


# `itlaudit sim` with a SIGINT recorded (model.stop's handler, the CLI's) before aiohttp takes the
# signals over: the moment the signal campaign cannot aim at, made certain by sending it first.
EARLY_SIGNAL = """
import os, signal
from itlaudit.model.stop import handle_signals
from itlaudit.serve.sim import SimConfig, serve
handle_signals()
os.kill(os.getpid(), signal.SIGINT)
serve(SimConfig(), port={port})
print("returned")
"""


@pytest.mark.fault_row("R12")
def test_a_signal_before_the_sim_serves_ends_it(tmp_path: Path) -> None:
    """A signal the CLI recorded before aiohttp installed its own handlers was never acted on: the
    simulator served on until killed. It now stops as it starts (the quiet neighbour is the test
    above: a Ctrl-C while it serves). ~1 s."""
    script = EARLY_SIGNAL.format(port=free_port())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stdout == "returned\n", done.stderr


def first_line_not_blank(stderr: str) -> str:
    assert stderr and not stderr.startswith(("\n", "\r")), repr(stderr[:80])
    return stderr.splitlines()[-1]


@pytest.mark.fault_row("N34")
@pytest.mark.parametrize(
    "args", [("run", "--bogus"), ("run", "missing.toml"), ("run", "--url", "http://127.0.0.1:1", "--prompt")]
)
def test_an_error_line_is_not_preceded_by_an_empty_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = itlaudit(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert first_line_not_blank(result.stderr).startswith("itlaudit: error: ")


@pytest.mark.fault_row("N34")
def test_an_error_after_the_run_began_is_not_preceded_by_an_empty_line(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, url_variant("A", f"http://127.0.0.1:{free_port()}"))
    result = itlaudit("run", str(scenario), "--out", str(tmp_path / "run"), cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith("itlaudit: error: cannot reach") and not result.stderr.startswith("\n")


@pytest.mark.fault_row("N34")
def test_the_interrupt_line_is_not_preceded_by_an_empty_line(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hello there, how are you?"]\nnum_requests = 200\nconcurrency = 2\nmax_tokens = 20'
    scenario = write_scenario(tmp_path, url_variant("A", url), workload)
    run = tmp_path / "run"
    command = [sys.executable, "-m", "itlaudit", "run", str(scenario), "--out", str(run)]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not ((run / "requests.jsonl").is_file() and (run / "requests.jsonl").stat().st_size):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert first_line_not_blank(stderr).startswith("itlaudit: interrupted by SIGINT")
    assert "\n\n" not in stderr
