"""The capture path end to end (`itlaudit run` against a paced SSE server in its own process): stamp
fidelity at 8 streams, the records writer's loss bound under SIGKILL, worker merge, and every fault a
server can send ending in one line or a finding."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pacedkit import itlaudit, lines, prompts, run, scenario

from itlaudit.store.jsonl import iter_jsonl

# --- fidelity and merge -----------------------------------------------------------------------------


def test_eight_streams_token_itl_within_3_percent_of_what_the_server_sent(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=4.0)
    workload = f"{prompts(8)}\nnum_requests = 8\nconcurrency = 8\nmax_tokens = 150"
    result = run(tmp_path, server.url, workload)
    assert result.returncode == 0, result.stderr
    sent = {row["prompt"]: row["sent"] for row in server.stop()["finished"]}
    raw = lines(tmp_path)
    derived = {row["request_id"]: row for row in lines(tmp_path, "derived.jsonl")}
    assert len(raw) == 8
    for index, record in enumerate(sorted(raw, key=lambda r: r["request_id"])):
        times = sent[f"p{index}"]
        assert len(record["chunk_t_ms"]) == len(times) == 150  # every chunk stamped
        assert record["chunk_tokens"] == list(range(1, 151))
        true_itl_ms = (times[-1] - times[0]) * 1000 / (len(times) - 1)
        measured = derived[record["request_id"]]["itl_ms"]
        assert measured == pytest.approx(true_itl_ms, rel=0.03), (record["request_id"], measured, true_itl_ms)
        assert (
            record["loop_lag_p99_ms"] is not None and record["loop_lag_max_ms"] >= record["loop_lag_p99_ms"]
        )


def test_workers_merge_into_one_run_with_unique_ids_and_exact_counts(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    workload = f"{prompts(3)}\nnum_requests = 10\nconcurrency = 3\nmax_tokens = 8"
    result = run(tmp_path, server.url, workload, "--workers", "3")
    assert result.returncode == 0, result.stderr
    raw = lines(tmp_path)
    assert sorted(r["request_id"] for r in raw) == [f"A-{i:05d}" for i in range(10)]
    assert all(r["worker"] == int(r["request_id"][2:]) % 3 for r in raw)  # request i → worker i mod 3
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    workers = meta["variants"]["A"]["workers"]
    assert [w["worker"] for w in workers] == [0, 1, 2]
    assert [w["requests"] for w in workers] == [4, 3, 3]
    for worker in workers:
        assert worker["clock_rtt_ns"] > 0
        # CLOCK_MONOTONIC is system-wide on Linux: the measured offset is within the ping's round trip.
        assert abs(worker["clock_offset_ns"]) <= worker["clock_rtt_ns"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["variants"]["A"]["requests"] == 10


# --- the records writer -------------------------------------------------------------------------------


@pytest.mark.fault_row("16")
@pytest.mark.fault_row("N31")
def test_sigkill_loses_at_most_the_requests_of_the_last_100_ms(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    path = scenario(tmp_path, f"{prompts(4)}\nnum_requests = 2000\nconcurrency = 4\nmax_tokens = 5")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "itlaudit",
            "run",
            str(path),
            "--url",
            server.url,
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    requests_file = tmp_path / "run" / "requests.jsonl"
    deadline = time.monotonic() + 60
    while not (requests_file.is_file() and requests_file.stat().st_size > 20_000):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)
    killed_at = time.monotonic()
    process.kill()
    process.wait()
    finished = [row["finished"] for row in server.stop()["finished"]]
    kept = list(iter_jsonl(requests_file))
    assert requests_file.read_bytes().endswith(b"\n")  # whole lines only
    finished_before_bound = sum(1 for t in finished if t <= killed_at - 0.1)
    assert len(kept) >= finished_before_bound > 0
    assert len({r["request_id"] for r in kept}) == len(kept)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    time.sleep(0.5)
    for worker in meta["variants"]["A"]["workers"]:  # capture workers die with the run
        assert not Path(f"/proc/{worker['pid']}").exists() or _zombie(worker["pid"])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.fault_row("18")
def test_a_full_disk_mid_run_is_one_line_exit_2_and_the_records_stay_whole(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=0.5)
    path = scenario(tmp_path, f"{prompts(2)}\nnum_requests = 40\nconcurrency = 2\nmax_tokens = 60")

    def small_files() -> None:  # the file-size limit stands in for a disk that fills up mid-run
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))

    result = itlaudit(
        "run",
        str(path),
        "--url",
        server.url,
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
        preexec_fn=small_files,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()  # progress lines, then the error: one line, last
    assert [line for line in lines if line.startswith("itlaudit:")] == lines[-1:]
    assert "cannot write" in result.stderr and "requests.jsonl" in result.stderr
    data = (tmp_path / "run" / "requests.jsonl").read_bytes()
    assert data.endswith(b"\n")
    kept = [json.loads(line) for line in data.splitlines()]
    assert 0 < len(kept) < 40


def test_writer_failure_is_raised_once_as_records_error(tmp_path: Path) -> None:
    from itlaudit.errors import RecordsError
    from itlaudit.store.jsonl import RecordWriter

    writer = RecordWriter(Path("/dev/full"))
    writer.write({"a": 1})
    with pytest.raises(RecordsError, match="No space left on device"):
        writer.close()


# --- faults a server can send: one finding or one line each --------------------------------------------


def run_fault(tmp_path: Path, paced, fault: str, *flags: str, workload: str = "") -> tuple[Any, Any]:
    server = paced(interval_ms=2.0, fault=fault, fault_after=3)
    workload = workload or f"{prompts(2)}\nnum_requests = 2\nconcurrency = 2\nmax_tokens = 10"
    result = run(tmp_path, server.url, workload, *flags)
    return result, server


def summary_findings(tmp_path: Path) -> dict[str, int]:
    return json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]["findings"]


@pytest.mark.fault_row("3")
def test_a_stall_is_cut_by_stall_timeout_and_kept(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "stall", "--stall-timeout", "0.5")
    assert result.returncode == 0, result.stderr
    raw = lines(tmp_path)
    assert [r["status"] for r in raw] == ["timeout", "timeout"]
    for record in raw:
        assert record["chunk_tokens"] == [1, 2, 3]
        assert record["e2e_ms"] >= record["chunk_t_ms"][-1] + 500
        assert record["timeout_limit"] == "stall_timeout_s"
    assert summary_findings(tmp_path)["stream_stalled"] == 2
    details = [d for row in lines(tmp_path, "derived.jsonl") for d in row["finding_details"]]
    stalled = [d for d in details if d["code"] == "stream_stalled"]
    assert stalled[0]["evidence"]["completion_tokens"] == 3
    assert stalled[0]["evidence"]["gap_ms"] >= 500


@pytest.mark.fault_row("6b")
def test_wrong_shape_json_is_a_stream_error_with_an_excerpt(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "wrong_shape")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for record in lines(tmp_path):
        assert record["status"] == "stream_error"
        assert "unexpected shape" in record["error"] and "[[" in record["error"]
        assert record["chunk_tokens"] == [1, 2, 3]
    assert summary_findings(tmp_path)["stream_error"] == 2


@pytest.mark.fault_row("5")
def test_invalid_utf8_is_a_finding_and_the_text_is_kept(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "invalid_utf8")
    assert result.returncode == 0, result.stderr
    for record in lines(tmp_path):
        assert record["status"] == "ok"
        assert record["invalid_utf8_chunks"] == 1
        assert "\ufffd" in record["text"] and len(record["chunk_t_ms"]) == 10
    assert summary_findings(tmp_path)["invalid_utf8"] == 2


@pytest.mark.fault_row("13")
def test_a_200_that_is_not_an_event_stream_names_its_content_type(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "not_sse")
    assert result.returncode == 0, result.stderr
    for record in lines(tmp_path):
        assert record["status"] == "stream_error"
        assert "content type application/json" in record["error"]
    assert summary_findings(tmp_path)["stream_error"] == 2


@pytest.mark.fault_row("7")
def test_a_429_is_a_finding_the_workload_goes_on_and_retry_after_is_honoured(tmp_path: Path, paced) -> None:
    workload = f"{prompts(1)}\nnum_requests = 3\nconcurrency = 1\nmax_tokens = 5"
    result, server = run_fault(tmp_path, paced, "rate_limit", workload=workload)
    assert result.returncode == 0, result.stderr
    statuses = [r["status"] for r in sorted(lines(tmp_path), key=lambda r: r["request_id"])]
    assert statuses == ["rate_limited", "ok", "ok"]
    assert lines(tmp_path)[0]["retry_after_s"] == 1.0
    assert summary_findings(tmp_path)["rate_limited"] == 1
    arrivals = server.stop()["arrivals"]
    assert arrivals[1] - arrivals[0] >= 1.0  # the slot waited out Retry-After before its next request


@pytest.mark.fault_row("8")
@pytest.mark.fault_row("N32")
def test_a_redirect_is_named_with_its_location_in_one_line(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "redirect")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "HTTP 301 redirect to /elsewhere" in result.stderr
    assert [r["status"] for r in lines(tmp_path)] != []


@pytest.mark.fault_row("12")
def test_n_above_1_is_refused_at_scenario_load(tmp_path: Path) -> None:
    path = scenario(tmp_path, f"{prompts(1)}\nextra_body = {{ n = 2 }}")
    result = itlaudit("run", str(path), "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 2
    assert "n = 2" in result.stderr and "one choice per request" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_timeout_fires_on_a_healthy_stream(tmp_path: Path, paced) -> None:
    result, _ = run_fault(tmp_path, paced, "none", "--stall-timeout", "0.5", "--request-timeout", "30")
    assert result.returncode == 0, result.stderr
    assert {r["status"] for r in lines(tmp_path)} == {"ok"}
    found = summary_findings(tmp_path)
    for code in ("stream_stalled", "stream_error", "invalid_utf8", "rate_limited", "http_error"):
        assert code not in found


# --- the self-audit ----------------------------------------------------------------------------------


def capture_in_process(url: str, *, block_ms: float, stamp: str = "loop") -> list[Any]:
    """Run one worker's share on this process's capture loop (what `worker_main` runs), with a task
    that blocks the loop for `block_ms` every 10 ms when asked to, and return each record's findings."""
    import asyncio

    from itlaudit.analysis.derive import derive_request
    from itlaudit.capture.client import StreamOptions
    from itlaudit.capture.lagprobe import new_capture_loop
    from itlaudit.capture.request_plan import plan_request
    from itlaudit.capture.workers import WorkerShare, capture_share
    from itlaudit.model.records import RequestParams
    from itlaudit.model.vocabulary import StampMode

    plans = [
        plan_request(
            base_url=url,
            endpoint="completions",
            model="paced",
            prompt=f"p{i}",
            params=RequestParams(max_tokens=60),
            request_id=f"A-{i:05d}",
            variant="A",
        )
        for i in range(2)
    ]
    share = WorkerShare(0, plans, 2, StreamOptions(stamp=StampMode(stamp)))
    loop, probe = new_capture_loop()
    records: list[Any] = []

    async def blocker() -> None:
        while True:
            await asyncio.sleep(0.01)
            time.sleep(block_ms / 1000)  # the loop does nothing else meanwhile: a saturated client

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(blocker())
        try:
            await capture_share(share, probe, records.append)
        finally:
            task.cancel()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    for record in records:
        record.loop_lag_p99_ms, record.loop_lag_max_ms = probe.window(*record.lag_window)
    return [derive_request(r) for r in records]


def test_client_saturated_fires_when_the_capture_loop_is_blocked(paced) -> None:
    server = paced(interval_ms=4.0)
    for figures in capture_in_process(server.url, block_ms=3.0):
        assert "client_saturated" in figures["findings"]
        detail = next(d for d in figures["finding_details"] if d["code"] == "client_saturated")
        assert detail["evidence"]["loop_lag_max_ms"] >= 2.5


def test_client_saturated_quiet_when_the_loop_keeps_up(paced) -> None:
    # 10 ms steps: the line is 0.5 ms of loop lag, above what a shared 2-core machine's scheduling adds.
    server = paced(interval_ms=10.0)
    for figures in capture_in_process(server.url, block_ms=0.0):
        assert "client_saturated" not in figures["findings"], figures["finding_details"]


def test_report_top_names_a_saturated_client_and_the_fix() -> None:
    from reportkit import block

    from itlaudit.analysis.summary import RunSummary
    from itlaudit.report.markdown import saturation_warning

    saturated = block(requests=4, findings={"client_saturated": 3})
    calm = block(requests=4, findings={"chunks_coalesced": 1})
    warning = saturation_warning(RunSummary(variants={"K0": calm, "K3": saturated}, run_findings=[]))
    assert warning is not None
    assert "K3 (3 of 4 requests)" in warning and "K0" not in warning
    assert "--workers" in warning and "fewer concurrent streams" in warning
    assert saturation_warning(RunSummary(variants={"K0": calm}, run_findings=[])) is None


def test_stamp_mode_is_chosen_on_the_command_line_and_recorded(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    result = run(tmp_path, server.url, f"{prompts(2)}\nnum_requests = 2\nmax_tokens = 5", "--stamp", "loop")
    assert result.returncode == 0, result.stderr
    assert {r["stamp"] for r in lines(tmp_path)} == {"loop"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--workers", "0"), "--workers '0'"),
        (("--stamp", "nic"), "'nic' is not one of 'kernel', 'loop'"),
        (("--stall-timeout", "0"), ""),
    ],
)
def test_bad_capture_options_are_one_line(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    path = scenario(tmp_path, prompts(1))
    result = itlaudit("run", str(path), "--url", "http://127.0.0.1:9", *flags, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_report_and_bisect_derive_from_raw_lines_never_from_copies_on_them(tmp_path: Path, paced) -> None:
    import csv

    from itlaudit.analysis.derive import derive_request
    from itlaudit.bisect.figures import read_trial
    from itlaudit.model.records import RequestRecord

    server = paced(interval_ms=1.0)
    result = run(tmp_path, server.url, f"{prompts(2)}\nnum_requests = 2\nmax_tokens = 20")
    assert result.returncode == 0, result.stderr
    raw_file = tmp_path / "run" / "requests.jsonl"
    raw = lines(tmp_path)
    assert not {"itl_ms", "findings", "finding_details", "ttft_ms"} & set(raw[0])  # raw only
    # An older itlaudit wrote figures on the raw line; a reader that trusted them would see 999.
    stale = [{**r, "itl_ms": 999.0, "findings": ["bogus"]} for r in raw]
    raw_file.write_text("".join(json.dumps(r) + "\n" for r in stale))
    (tmp_path / "run" / "derived.jsonl").unlink()
    result = itlaudit("report", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    derived = lines(tmp_path, "derived.jsonl")
    assert [d["request_id"] for d in derived] == [r["request_id"] for r in raw]
    expected = [derive_request(RequestRecord.from_json(r)) for r in raw]
    assert [d["itl_ms"] for d in derived] == [e["itl_ms"] for e in expected]
    assert all(d["itl_ms"] < 10 and "bogus" not in d["findings"] for d in derived)
    with (tmp_path / "run" / "requests.csv").open() as fh:
        assert [float(row["itl_ms"]) for row in csv.DictReader(fh)] == [d["itl_ms"] for d in derived]
    (trial,) = read_trial(tmp_path / "run").values()
    assert trial.itl_ms == [d["itl_ms"] for d in derived]


@pytest.mark.parametrize("count", [1, 2, 7, 100, 1001])
def test_loop_lag_window_is_numpys_p99_and_max_of_the_streams_samples(count: int) -> None:
    import random

    import numpy as np

    from itlaudit.capture.lagprobe import new_capture_loop

    loop, probe = new_capture_loop()
    loop.close()
    rng = random.Random(count)
    probe.samples_ms = [rng.expovariate(5.0) for _ in range(count + 10)]
    inside = np.asarray(probe.samples_ms[5 : 5 + count])
    p99, top = probe.window(5, 5 + count)
    assert p99 == pytest.approx(float(np.percentile(inside, 99)), rel=1e-12)
    assert top == float(inside.max())
    assert probe.window(len(probe.samples_ms), len(probe.samples_ms)) == (None, None)


FORKSERVER_FOLDER = (
    "from itlaudit.capture.workers import prestart_workers\nprestart_workers()\n"
    "import multiprocessing.util\nprint(multiprocessing.util.get_temp_dir())"
)


@pytest.mark.parametrize("depth", [0, 90])
def test_capture_workers_start_under_a_tmpdir_too_deep_for_a_unix_socket(tmp_path: Path, depth: int) -> None:
    """The forkserver's socket lives in multiprocessing's folder under TMPDIR; with TMPDIR 90 bytes deep
    (a test's folder under pytest-xdist was enough) every run ended in "OSError: AF_UNIX path too
    long". Such a folder is made under /tmp; a TMPDIR that fits keeps it. A fresh interpreter each,
    ~1 s."""
    tmpdir = tmp_path / ("d" * max(1, depth - len(str(tmp_path))))
    tmpdir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", FORKSERVER_FOLDER],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == (Path("/tmp") if depth else tmpdir), folder
