"""A run folder a run is still writing (store.lock): the lock itself, `report`/`diff`/`export` and a second
run refused on a live folder, `--live` writing apart from the run's files, and a run that ends however
it ends rewriting its summary from every record. Faults campaign 2026-12-04, rows N1 and N26."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import itlaudit, one_error_line, url_variant, write_scenario

from itlaudit.errors import RunDirError
from itlaudit.store.lock import LOCK_FILE, Holder, hold_run_lock, live_holder

pytestmark = pytest.mark.heavy  # runs held open against simulated servers while readers look: tens of seconds

# A process that takes DIR's lock, says so, and holds it until killed: a run stand-in whose pid we know.
HOLDER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from itlaudit.store.lock import hold_run_lock\n"
    "with hold_run_lock(Path(sys.argv[1]), 'test'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


def _hold(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=10)


def _start_run(folder: Path, url: str, workload: str, out: Path, *args: str) -> subprocess.Popen[str]:
    """`itlaudit run` of one variant at `url` in the background, writing into `out`."""
    scenario = write_scenario(folder, url_variant("A", url), workload)
    return subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "run", str(scenario), "--out", str(out), *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_lines(path: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_bytes().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


def test_the_lock_names_its_holder_while_held_and_goes_with_it(tmp_path: Path) -> None:
    assert live_holder(tmp_path) is None
    with hold_run_lock(tmp_path, "--out x"):
        holder = live_holder(tmp_path)
        assert holder == Holder(os.getpid(), socket.gethostname(), holder.started_at_unix if holder else None)
        assert holder is not None and holder.describe() == f"a run (pid {os.getpid()})"
    assert live_holder(tmp_path) is None
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    proc = _hold(tmp_path)
    try:
        refused = pytest.raises(
            RunDirError, match=rf"^--out x: a run \(pid {proc.pid}\) is still writing it;"
        )
        with refused, hold_run_lock(tmp_path, "--out x"):
            pass
    finally:
        _kill(proc)


def test_a_lock_left_by_a_killed_run_is_stale_not_trusted(tmp_path: Path) -> None:
    proc = _hold(tmp_path)
    _kill(proc)  # SIGKILL: no chance to remove its file
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid
    assert live_holder(tmp_path) is None
    with hold_run_lock(tmp_path, "--out x"):  # taken over, not refused
        assert (holder := live_holder(tmp_path)) is not None and holder.pid == os.getpid()


def test_without_locks_on_the_file_system_the_pid_decides(tmp_path: Path, monkeypatch) -> None:
    """ENOLCK (NFS without lockd): a live pid on this host still marks the folder; a dead one does not."""
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = socket.gethostname()
    monkeypatch.setattr(fcntl, "flock", no_locks)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": host}))
    assert live_holder(tmp_path) is None
    with hold_run_lock(tmp_path, "--out x"):
        assert (holder := live_holder(tmp_path)) is not None and holder.pid == os.getpid()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": os.getppid(), "host": host}))
    refused = pytest.raises(RunDirError, match=rf"a run \(pid {os.getppid()}\) is still writing it")
    with refused, hold_run_lock(tmp_path, "--out x"):
        pass


def _finished_run(tmp_path: Path, faultserver) -> tuple[Path, Path]:
    """A finished run folder of 4 requests, and its scenario."""
    path = write_scenario(tmp_path, url_variant("A", faultserver("clean")))
    out = tmp_path / "run"
    assert itlaudit("run", str(path), "--out", str(out), cwd=tmp_path).returncode == 0
    return out, path


def test_readers_and_a_second_run_refuse_a_live_folder(faultserver, tmp_path: Path) -> None:
    out, scenario = _finished_run(tmp_path, faultserver)
    summary = (out / "summary.json").read_bytes()
    proc = _hold(out)
    try:
        expected = f"a run (pid {proc.pid}) is still writing {out}; wait, or pass --live"
        for args in (["report", str(out)], ["diff", str(out), str(out)], ["export", str(out)]):
            assert _message(one_error_line(itlaudit(*args, cwd=tmp_path))) == expected, args
        for extra in ([], ["--append"]):
            line = one_error_line(itlaudit("run", str(scenario), "--out", str(out), *extra, cwd=tmp_path))
            assert _message(line) == (
                f"--out {out}: a run (pid {proc.pid}) is still writing it; wait for it to end, "
                "or choose another folder"
            ), extra
        assert (out / "summary.json").read_bytes() == summary  # nothing of the run's was touched

        live = itlaudit("report", str(out), "--live", cwd=tmp_path)
        assert live.returncode == 0, live.stderr
        assert f"report: {(out / 'partial' / 'report.md').resolve()}" in live.stdout
        partial = json.loads((out / "partial" / "summary.json").read_text())
        assert partial["partial"]["pid"] == proc.pid and partial["records"]["lines"] == 4
        report_md = (out / "partial" / "report.md").read_text()
        assert report_md.startswith("# itlaudit: partial: run still in progress: t\n")
        assert f"The run (pid {proc.pid}) was still writing its folder" in report_md
        assert "partial: run still in progress" in (out / "partial" / "report.html").read_text()
        assert (out / "summary.json").read_bytes() == summary

        diff = itlaudit("diff", str(out), str(out), "--live", cwd=tmp_path)
        assert diff.returncode == 0 and diff.stdout.startswith("> **partial: run still in progress**")
        export = itlaudit("export", str(out), "--live", cwd=tmp_path)
        assert export.returncode == 0 and (out / "partial" / "chunks.csv").is_file()
    finally:
        _kill(proc)
    # The holder is gone: its lock is stale, and the full report supersedes the partial one.
    assert itlaudit("report", str(out), cwd=tmp_path).returncode == 0
    assert not (out / "partial").exists()


def test_live_on_a_finished_folder_is_the_plain_report(faultserver, tmp_path: Path) -> None:
    out, _ = _finished_run(tmp_path, faultserver)
    result = itlaudit("report", str(out), "--live", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"report: {(out / 'report.md').resolve()}" in result.stdout
    assert not (out / "partial").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert "partial" not in summary and summary["records"] == {
        "file": "requests.jsonl",
        "lines": 4,
        "warmup": 0,
    }


def _message(line: str) -> str:
    """An error line without its prefix ("itlaudit: ", and "error: " where the CLI adds it)."""
    assert line.startswith("itlaudit: "), line
    return line.removeprefix("itlaudit: ").removeprefix("error: ")


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


@pytest.mark.fault_row("N26")
def test_report_on_a_folder_a_run_is_writing(faultserver, tmp_path: Path) -> None:
    """A real run: `report` refuses, `--live` writes partial/ only, and the run's end rewrites its own
    summary from all of its records and removes partial/."""
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 40\nconcurrency = 1\nmax_tokens = 10\ntemperature = 0'
    out = tmp_path / "run"
    run = _start_run(tmp_path, url, workload, out)
    try:
        _wait_for_lines(out / "requests.jsonl", 2)
        line = _message(one_error_line(itlaudit("report", str(out), cwd=tmp_path)))
        assert line == f"a run (pid {run.pid}) is still writing {out}; wait, or pass --live"
        assert not (out / "summary.json").exists()
        live = itlaudit("report", str(out), "--live", cwd=tmp_path)
        assert live.returncode == 0, live.stderr
        if run.poll() is None:  # the run may have ended meanwhile: then there is no partial to see
            partial = json.loads((out / "partial" / "summary.json").read_text())
            assert 2 <= partial["records"]["lines"] < 40 and partial["partial"]["pid"] == run.pid
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["lines"] == _lines(out / "requests.jsonl") == 40
    assert summary["variants"]["A"]["requests"] == 40
    assert not (out / "partial").exists() and not (out / LOCK_FILE).exists()


@pytest.mark.fault_row("N1")
def test_a_run_whose_capture_worker_dies_still_writes_its_summary(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean", "--step-ms", "10")
    workload = 'prompts = ["hi"]\nnum_requests = 200\nconcurrency = 4\nmax_tokens = 10\ntemperature = 0'
    out = tmp_path / "run"
    run = _start_run(tmp_path, url, workload, out, "--workers", "2")
    try:
        _wait_for_lines(out / "requests.jsonl", 8)
        workers = json.loads((out / "meta.json").read_text())["variants"]["A"]["workers"]
        os.kill(workers[0]["pid"], signal.SIGKILL)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 2 and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("itlaudit:")]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr
    assert _message(errors[0]).startswith("capture worker 0 exited with code -9 after "), stderr
    kept = _lines(out / "requests.jsonl")
    assert 8 <= kept < 200
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["lines"] == kept == summary["variants"]["A"]["requests"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["failed"]["error"].startswith("capture worker 0 exited with code -9")
    assert "**failed**: capture worker 0 exited" in (out / "report.md").read_text()
    assert not (tmp_path / "reports" / "ledger.jsonl").exists()  # a failed run is no experiment


@pytest.mark.fault_row("N26")
def test_an_interrupted_run_rewrites_its_summary_and_drops_the_partial_report(
    faultserver, tmp_path: Path
) -> None:
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 400\nconcurrency = 1\nmax_tokens = 10\ntemperature = 0'
    out = tmp_path / "run"
    run = _start_run(tmp_path, url, workload, out)
    try:
        _wait_for_lines(out / "requests.jsonl", 2)
        assert itlaudit("report", str(out), "--live", cwd=tmp_path).returncode == 0
        assert (out / "partial" / "summary.json").is_file()  # 400 requests take far longer than this
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["records"]["lines"] == _lines(out / "requests.jsonl") == summary["variants"]["A"]["requests"]
    )
    assert "partial" not in summary
    assert not (out / "partial").exists() and not (out / LOCK_FILE).exists()
