"""One end-to-end CLI test per fault of issue 10 that is not the client's: each ends in one line or
a finding, with the exit code, the line printed and what is on disk checked. Servers are
tests/faultserver.py processes (one fault mode each), launched the way a user's server would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import FAULTSERVER, itlaudit, one_error_line, processes_tagged, url_variant, write_scenario

from itlaudit.serve.sim import SIM_VERSION

# --- item 2: identity is best effort -------------------------------------------------------------


@pytest.mark.fault_row("G2")
@pytest.mark.parametrize("mode", ["no_version", "stream_only"])
def test_server_without_version_or_non_streaming_answer_is_run_with_build_unknown(
    faultserver, tmp_path: Path, mode: str
) -> None:
    url = faultserver(mode)
    path = write_scenario(tmp_path, url_variant("A", url))
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "A: server build unknown" in result.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    build = meta["variants"]["A"]["fingerprint"]["build"]
    assert build["url"] == url
    if mode == "no_version":
        assert "/version answered HTTP 404" in result.stderr
        # Recovered from the system_fingerprint, itlaudit-sim-<version>-<hash>: the simulator, not vLLM.
        assert build["version"] == SIM_VERSION
    else:
        assert build["system_fingerprint"] is None and "non-streaming ping" in result.stderr
    lines = (tmp_path / "run" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)["status"] == "ok" for line in lines)
    ledger = [json.loads(line) for line in (tmp_path / "reports" / "ledger.jsonl").read_text().splitlines()]
    assert ledger[0]["fingerprint_parts"]["build"]["url"] == url


def test_metrics_window_holds_only_the_workload(faultserver, tmp_path: Path) -> None:
    """The identity ping, the /version read and lossless re-scoring all fall outside each variant's
    /metrics before/after scrape."""
    log = tmp_path / "requests.log"
    url = faultserver("clean", "--request-log", str(log))
    variants = url_variant("K0", url) + url_variant("K3", url)
    # The periodic /metrics sampler (its own scrapes, tested in test_server_metrics.py) is off here, so
    # the log's scrapes are the window's own.
    scenario = str(write_scenario(tmp_path, variants))
    result = itlaudit("compare", scenario, "--out", str(tmp_path / "c"), "--no-server-metrics", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    scrapes = [e for e in entries if e["path"] == "/metrics"]
    assert len(scrapes) == 4  # before/after, per variant
    windows = [(scrapes[0]["end"], scrapes[1]["start"]), (scrapes[2]["end"], scrapes[3]["start"])]
    for start, end in windows:
        # /v1/models (the runner resolving `auto`) generates nothing and is not counted by vLLM.
        inside = [e for e in entries if e["start"] < end and e["end"] > start and e["path"] != "/v1/models"]
        assert inside and all(e["stream"] is True for e in inside), inside
        assert len(inside) == 4
    own = [e for e in entries if e["path"] == "/version" or e["stream"] is False]
    assert own  # the identity ping and /version reads happened, just not inside a window


# --- item 4: one redaction policy -----------------------------------------------------------------

SECRETS = {
    "env": "sk-planted-env-0001",
    "arg": "sk-planted-arg-0002",
    "arg_eq": "sk-planted-argeq-0003",
    "shell": "hf_planted_shell_0004",
}


def test_no_planted_secret_reaches_any_file_a_run_writes(tmp_path: Path) -> None:
    command = json.dumps(
        [
            sys.executable,
            FAULTSERVER,
            "--port",
            "{port}",
            "--api-key",
            SECRETS["arg"],
            f"--api-key={SECRETS['arg_eq']}",
        ]
    )
    variants = (
        '[[variants]]\nname = "K0"\n\n[variants.launch]\nkind = "command"\n'
        f"command = {command}\n"
        f'env = {{ VLLM_API_KEY = "{SECRETS["env"]}", VLLM_LOGGING_LEVEL = "INFO" }}\n'
    )
    path = write_scenario(tmp_path, variants)
    result = itlaudit(
        "compare", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path, env={"HF_TOKEN": SECRETS["shell"]}
    )
    assert result.returncode == 0, result.stderr
    written = [p for p in [*(tmp_path / "run").rglob("*"), *(tmp_path / "reports").rglob("*")] if p.is_file()]
    assert {p.name for p in written} >= {"meta.json", "ledger.jsonl", "report.md", "server-K0.log"}
    for file in written:
        data = file.read_bytes()
        for secret in SECRETS.values():
            assert secret.encode() not in data, f"{secret} in {file}"
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    fingerprint = meta["variants"]["K0"]["fingerprint"]
    assert fingerprint["env"]["VLLM_API_KEY"] == "***" and fingerprint["env"]["HF_TOKEN"] == "***"
    assert fingerprint["env"]["VLLM_LOGGING_LEVEL"] == "INFO"  # not a secret: kept
    assert (
        "--api-key" in fingerprint["build"]["command"] and "--api-key=***" in fingerprint["build"]["command"]
    )
    assert "***" in (tmp_path / "run" / "server-K0.log").read_text()  # the log keeps its shape


# --- item 8: the run folder -----------------------------------------------------------------------


@pytest.mark.fault_row("20")
@pytest.mark.fault_row("N5")
def test_existing_run_folder_is_refused_and_append_keeps_ids_unique(faultserver, tmp_path: Path) -> None:
    path = write_scenario(tmp_path, url_variant("A", faultserver("clean")))
    out = tmp_path / "run"
    assert itlaudit("run", str(path), "--out", str(out), cwd=tmp_path).returncode == 0
    before = (out / "requests.jsonl").read_bytes()
    line = one_error_line(itlaudit("run", str(path), "--out", str(out), cwd=tmp_path))
    assert "already holds a run" in line and "--append" in line
    assert (out / "requests.jsonl").read_bytes() == before
    # A crash mid-write left half a line: --append must not glue onto it.
    (out / "requests.jsonl").write_bytes(before + b'{"request_id": "A-0000')
    appended = itlaudit("run", str(path), "--out", str(out), "--append", cwd=tmp_path)
    assert appended.returncode == 0, appended.stderr
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    ids = [line["request_id"] for line in lines]
    assert len(ids) == 8 and len(set(ids)) == 8
    # Lines land in the order requests finish, which concurrent requests need not keep.
    assert sorted(ids[4:]) == ["A.r2-00000", "A.r2-00001", "A.r2-00002", "A.r2-00003"]
    assert json.loads((out / "summary.json").read_text())["variants"]["A"]["requests"] == 8


@pytest.mark.fault_row("19")
def test_unwritable_out_is_one_line(faultserver, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through permissions; covered by the read-only bind below when available")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = write_scenario(tmp_path, url_variant("A", "http://127.0.0.1:9"))
    line = one_error_line(itlaudit("run", str(path), "--out", str(locked / "run"), cwd=tmp_path))
    assert "cannot write the run folder" in line and "Permission denied" in line


@pytest.mark.fault_row("19")
def test_out_under_a_file_is_one_line(tmp_path: Path) -> None:
    """What root hits too: --out below something that is not a folder."""
    (tmp_path / "afile").write_text("x")
    path = write_scenario(tmp_path, url_variant("A", "http://127.0.0.1:9"))
    line = one_error_line(itlaudit("run", str(path), "--out", str(tmp_path / "afile" / "run"), cwd=tmp_path))
    assert "cannot write the run folder" in line and "choose another --out" in line


# --- item 7: signals ------------------------------------------------------------------------------


def _wait_for_lines(path: Path, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} lines")


@pytest.mark.fault_row("17")
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"])
def test_signal_keeps_finished_requests_and_writes_the_report(
    faultserver, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 40\nconcurrency = 1\nmax_tokens = 10\ntemperature = 0'
    path = write_scenario(tmp_path, url_variant("A", url), workload)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "run", str(path), "--out", str(out)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_lines(out / "requests.jsonl", 2)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    # Progress lines (report/progress) come first; the interrupt is the one itlaudit: line, last.
    lines = [line for line in stderr.strip().splitlines() if line.startswith("itlaudit:")]
    assert len(lines) == 1 and stderr.strip().endswith(lines[0]), stderr
    assert lines[0].startswith(f"itlaudit: interrupted by {sig.name}"), stderr
    kept = len((out / "requests.jsonl").read_text().splitlines())
    assert 2 <= kept < 40 and f"{kept} finished requests kept" in lines[0]
    assert json.loads((out / "summary.json").read_text())["variants"]["A"]["requests"] == kept
    assert (out / "report.md").is_file()
    assert json.loads((out / "meta.json").read_text())["interrupted"]["signal"] == sig.name
    assert not (tmp_path / "reports" / "ledger.jsonl").exists()  # a partial run is no experiment


@pytest.mark.fault_row("24")
def test_sigkill_of_compare_leaves_no_launched_server(tmp_path: Path) -> None:
    sim = json.dumps([sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "50"])
    variants = f'[[variants]]\nname = "K0"\n\n[variants.launch]\nkind = "command"\ncommand = {sim}\n'
    workload = 'prompts = ["hi"]\nnum_requests = 50\nconcurrency = 1\nmax_tokens = 20\ntemperature = 0'
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "itlaudit",
            "compare",
            str(write_scenario(tmp_path, variants, workload)),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_lines(out / "requests.jsonl", 1)
    assert processes_tagged(out), "the launched server should be running mid-run"
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while processes_tagged(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_tagged(out) == []


def test_orphan_left_by_a_dead_itlaudit_is_reaped_on_the_next_launch(tmp_path: Path) -> None:
    """The pid-file fallback: a server whose owner is gone (PDEATHSIG did not reach it) is killed
    before the next server starts."""
    from itlaudit.serve.orphans import OWNER_ENV, pid_dir, reap_orphans

    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        start_new_session=True,
        env={**os.environ, OWNER_ENV: str(dead_owner.pid)},  # the tag the launcher gives every server
    )
    pid_dir().mkdir(mode=0o700, exist_ok=True)
    (pid_dir() / f"{orphan.pid}.json").write_text(
        json.dumps({"pgid": orphan.pid, "owner": dead_owner.pid, "docker_name": None})
    )
    assert orphan.pid in reap_orphans()
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    assert not (pid_dir() / f"{orphan.pid}.json").exists()


# --- item 11: report.md escapes server strings --------------------------------------------------


@pytest.mark.fault_row("31")
def test_markup_in_a_server_error_is_escaped_in_report_md(faultserver, tmp_path: Path) -> None:
    path = write_scenario(tmp_path, url_variant("A", faultserver("markup_error")))
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "run" / "report.md").read_text()
    assert "&lt;img src=x" in report  # the message is there, as text
    assert "<img" not in report and "**bold**" not in report and "[link](" not in report
