"""End-to-end CLI tests for the capture rows of the 2026-12-04 fault campaign (issue 23): a compressed
event stream (row 9), interleaved choices (row 12), capture workers outliving a killed coordinator (N2)
and a password in the URL (N15b). Each fault fires against a tests/faultserver.py mode, and a clean
neighbour (the same server code, the fault off) stays quiet."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from faultkit import itlaudit, url_variant, write_scenario

WORKLOAD = 'prompts = ["hi"]\nnum_requests = 2\nconcurrency = 1\nmax_tokens = 12\ntemperature = 0'


def run_one(
    start: Any, mode: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`itlaudit run` of WORKLOAD against a faultserver in MODE; the derived lines (record + findings)."""
    path = write_scenario(tmp_path, url_variant("A", start(mode)), WORKLOAD)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    derived = {}
    for text in (tmp_path / "run" / "derived.jsonl").read_text().splitlines():
        line = json.loads(text)
        derived[line["request_id"]] = line
    records = [json.loads(text) for text in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    return result, [{**record, **derived[record["request_id"]]} for record in records]


def codes(line: dict[str, Any]) -> set[str]:
    return set(line["findings"])


# --- row 9: a compressed event stream ------------------------------------------------------------


@pytest.mark.fault_row("9")
@pytest.mark.parametrize("mode", ["gzip_sse", "deflate_sse", "plain_sse"])
def test_compressed_stream_is_decoded_with_a_stamp_per_read(faultserver, tmp_path: Path, mode: str) -> None:
    result, lines = run_one(faultserver, mode, tmp_path)
    assert result.returncode == 0, result.stderr
    for line in lines:
        assert line["status"] == "ok", line["error"]
        assert line["text"] == "".join(f" a{step}" for step in range(1, 13))
        assert len(line["chunk_t_ms"]) == 12  # one chunk per event, as uncompressed
        # The server flushes every 2 ms: decoded pieces keep their own reads' stamps, not one burst.
        assert len(set(line["chunk_t_ms"])) >= 6, line["chunk_t_ms"]
        assert codes(line) == set(), line["findings"]


@pytest.mark.fault_row("9")
def test_undecodable_coding_is_a_stream_error_naming_it(faultserver, tmp_path: Path) -> None:
    result, lines = run_one(faultserver, "br_sse", tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line["status"] for line in lines] == ["stream_error"] * 2
    assert all("Content-Encoding br" in line["error"] and line["text"] == "" for line in lines)


# --- row 12: a server that interleaves choices[].index -------------------------------------------


@pytest.mark.fault_row("12")
def test_interleaved_choices_are_a_finding_and_not_one_reply(faultserver, tmp_path: Path) -> None:
    result, lines = run_one(faultserver, "interleaved", tmp_path)
    assert result.returncode == 0, result.stderr
    for line in lines:
        assert "choices_interleaved" in codes(line), line["findings"]
        assert line["status"] == "stream_error" and "interleaved" in line["error"]
        assert line["other_index_chunks"] == 12
        assert line["text"] == "".join(f" a{step}" for step in range(1, 13))  # index 0's only
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["variants"]["A"]["errors"] == 2  # neither stream counted as a reply


def test_single_choice_stream_has_no_interleaving_finding(faultserver, tmp_path: Path) -> None:
    _, lines = run_one(faultserver, "plain_sse", tmp_path)
    assert all(line["other_index_chunks"] == 0 and "choices_interleaved" not in codes(line) for line in lines)


# --- N2: capture workers die with the coordinator -------------------------------------------------


def _wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"{path} did not reach {count} lines: {proc.communicate()}")


@pytest.mark.fault_row("N2")
def test_workers_send_nothing_after_the_coordinator_is_killed(faultserver, tmp_path: Path) -> None:
    arrivals = tmp_path / "arrivals.jsonl"
    url = faultserver("clean", "--step-ms", "10", "--arrival-log", str(arrivals))
    workload = 'prompts = ["hi"]\nnum_requests = 400\nconcurrency = 8\nmax_tokens = 20\ntemperature = 0'
    path = write_scenario(tmp_path, url_variant("A", url), workload)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "run", str(path), "--out", str(out), "--workers", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_lines(out / "requests.jsonl", 8, proc)  # both workers streaming, 8 streams open
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = proc.communicate(timeout=30)  # EOF only once every worker holding stderr is gone too
    time.sleep(0.5)  # a lingering worker would send within this
    late = [
        entry["arrived"] - killed
        for entry in map(json.loads, arrivals.read_text().splitlines())
        if entry["path"] == "/v1/completions" and entry["arrived"] > killed + 0.1
    ]
    assert not late, f"requests arrived {late} s after the coordinator's SIGKILL"
    assert "Traceback" not in stderr and "Broken pipe" not in stderr, stderr


def test_workers_of_a_finished_run_exit_normally(faultserver, tmp_path: Path) -> None:
    """The clean neighbour: the coordinator outlives its workers, so the watch never fires early."""
    url = faultserver("clean")
    workload = 'prompts = ["hi"]\nnum_requests = 8\nconcurrency = 4\nmax_tokens = 8\ntemperature = 0'
    path = write_scenario(tmp_path, url_variant("A", url), workload)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 8 and all(json.loads(line)["status"] == "ok" for line in lines)


# --- N15b: a password in the URL ------------------------------------------------------------------

PASSWORD = "sekritPW"


@pytest.mark.parametrize("where", ["variant", "flag"])
def test_url_password_is_masked_in_every_file_and_line(faultserver, tmp_path: Path, where: str) -> None:
    url = faultserver("clean").replace("http://", f"http://auditor:{PASSWORD}@")
    variant = url_variant("A", url) if where == "variant" else '[[variants]]\nname = "A"\n\n'
    path = write_scenario(tmp_path, variant, WORKLOAD)
    flags = ["--url", url] if where == "flag" else []
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert all(json.loads(line)["url"].startswith("http://auditor:***@") for line in records)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".log" and p != path]
    assert {p.name for p in written} >= {"meta.json", "requests.jsonl", "requests.csv", "ledger.jsonl"}
    leaks = [p.name for p in written if PASSWORD.encode() in p.read_bytes()]
    assert not leaks and PASSWORD not in result.stdout + result.stderr, (leaks, result.stdout, result.stderr)
    assert "auditor:***@" in (tmp_path / "run" / "meta.json").read_text()


def test_url_without_userinfo_is_written_as_given(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean")
    path = write_scenario(tmp_path, url_variant("A", url), WORKLOAD)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert all(json.loads(line)["url"] == url + "/v1/completions" for line in records)
    assert "***" not in (tmp_path / "run" / "meta.json").read_text()
