"""Whole bisections: the `command` provider starts the simulator as "vLLM at commit X", with a
regression hidden from one commit on, and `itlaudit bisect` has to name that commit.

These run real servers and real scenario runs (about a second or two per probe), so ranges and
workloads are small; the 130-commit repository checks the probe bound on a realistic range size.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from itlaudit import cli

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM, FIXTURES, PROBE_SCENARIO, make_repo

PY = sys.executable


def _commits(path: Path, count: int) -> list[str]:
    shas = [os.urandom(20).hex() for _ in range(count)]
    path.write_text("".join(f"{s}\n" for s in shas))
    return shas


def _args(commits: Path, bad_from: int, mode: str, *, missing: list[str] | None = None) -> list[str]:
    server = (
        f"{PY} {FAKE_VLLM} serve --commits {commits} --bad-from {bad_from} --mode {mode} {{commit}} {{port}}"
    )
    args = ["--provider", "command", "--server-cmd", server, "--ready-timeout", "30"]
    if missing:
        args += ["--build-cmd", f"{PY} {FAKE_VLLM} build --missing {','.join(missing)} {{commit}}"]
    return args


def _bisect(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["itlaudit", "bisect", *args])
    try:
        cli.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _state(folder: Path) -> dict:
    return json.loads((folder / "bisect.json").read_text())


def test_git_repo_truncation_found_within_probe_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shas = make_repo(tmp_path / "vllm", 130)
    culprit = 83
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{s}\n" for s in shas))
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0][:9], "--to", shas[-1][:9], "--repo", str(tmp_path / "vllm"),
        *_args(commits, culprit, "cap"),
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["status"] == "done"
    assert state["first_bad"] == shas[culprit] and state["last_good"] == shas[culprit - 1]
    assert len(state["probes"]) <= math.ceil(math.log2(len(shas))) + 2
    assert state["compare_url"].endswith(f"/compare/{shas[culprit - 1]}...{shas[culprit]}")
    for probe in state["probes"]:
        folder = Path(probe["dir"])
        assert (folder / "server-build.log").is_file()
        assert (folder / "trial-1" / "requests.jsonl").is_file() and (
            folder / "trial-1" / "summary.json"
        ).is_file()
        assert probe["commit"] == shas[probe["index"]]
        assert probe["verdict"] == ("bad" if probe["index"] >= culprit else "good")
    report = (out / "report.md").read_text()
    assert f"first bad build: {shas[culprit][:9]}" in report
    assert f"https://github.com/vllm-project/vllm/commit/{shas[culprit]}" in report
    assert (out / "bisect.png").stat().st_size > 1000
    # Piped, a line is never broken at 80 columns: each probe's line stays whole in a CI log.
    said = capsys.readouterr()
    lines = [*said.out.splitlines(), *said.err.splitlines()]
    probes = [line for line in lines if line.startswith("  ")]
    assert probes and all(line.endswith("probe(s) to go") for line in probes), lines


def test_unavailable_builds_next_to_the_culprit_give_an_honest_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = _commits(tmp_path / "commits.txt", 12)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 7, "cap", missing=[shas[6], shas[7]]),
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["first_bad"] is None
    assert state["candidates"] == shas[6:9] and state["last_good"] == shas[5]
    skipped = {p["index"] for p in state["probes"] if p["verdict"] == "skip"}
    assert skipped == {6, 7}
    assert "is one of 3" in state["message"]


def test_noisy_itl_regression_found_with_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MTP acceptance collapse: same step time, fewer tokens per step, so token ITL rises ~3x with
    per-request noise from random acceptance; the U test over repeated trials must still call it."""
    shas = _commits(tmp_path / "commits.txt", 12)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 5, "acceptance"),
        "--scenario", str(FIXTURES / "probe-itl.toml"), "--regress", "itl", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["first_bad"] == shas[5]
    assert all(p["trials"] >= 3 for p in state["probes"])
    bad = [p for p in state["probes"] if p["verdict"] == "bad"]
    assert bad and all(p["detail"]["ratio"] > 1.5 and p["detail"]["p_value"] < 0.05 for p in bad)


@pytest.mark.heavy  # tens of seconds of simulated servers
def test_speedup_runs_k0_and_k3_in_each_probe_and_judges_their_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MTP collapse hits K3 only: K0's token ITL stays, K3's rises, so the K3/K0 ratio flips."""
    shas = _commits(tmp_path / "commits.txt", 10)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 6, "mtp-collapse"), "--scenario", str(FIXTURES / "probe-k0-k3.toml"),
        "--only", "K0", "--only", "K3", "--regress", "speedup", "--trials", "2", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["first_bad"] == shas[6] and state["signals"] == ["speedup"]
    for probe in state["probes"]:
        assert list(probe["metrics"]) == ["K0", "K3"]
        assert "K3/K0 token ITL" in probe["reason"]
    bad = [p for p in state["probes"] if p["verdict"] == "bad"]
    assert bad and all(p["detail"]["ratio"] > 1.5 and p["detail"]["p_value"] < 0.05 for p in bad)


def test_a_launch_table_without_kind_gives_the_command_providers_server_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe-k0-k3.toml's launch tables name no `kind` and no dummy `python` (issue 36 item 6): bisect
    with `--provider command` runs it, and K3's --speculative-config reaches its server command (the
    stand-in serves K=3 only when given it: ~3.9 tokens per chunk, where it would send 1). CI cost:
    ~2-5 s (two probes, the ends, of one variant: two server starts)."""
    shas = _commits(tmp_path / "commits.txt", 2)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 1, "cap"), "--scenario", str(FIXTURES / "probe-k0-k3.toml"),
        "--only", "K3", "--regress", "truncation", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["first_bad"] == shas[1] and state["last_good"] == shas[0]
    assert [p["metrics"]["K3"]["tokens_per_chunk_p50"] > 2 for p in state["probes"]] == [True, True]


def test_find_fix_with_a_git_bisect_run_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shas = _commits(tmp_path / "commits.txt", 10)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 4, "fix"), "--find-fix",
        "--scenario", str(PROBE_SCENARIO), "--script", f"{PY} {FIXTURES / 'truncated.py'}", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    state = _state(out)
    assert state["first_bad"] == shas[4]
    assert state["message"].startswith("first fixed build")
    assert all((Path(p["dir"]) / "script.log").exists() for p in state["probes"])


def test_good_end_that_is_bad_stops_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shas = _commits(tmp_path / "commits.txt", 6)
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 0, "cap"),
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"itlaudit: error: GOOD ({shas[0]}) is bad, not good: " in err
    assert _state(tmp_path / "b")["status"] == "failed"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_resume_after_sigkill_mid_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shas = _commits(tmp_path / "commits.txt", 12)
    out = tmp_path / "bisect"
    argv = [
        str(Path(PY).with_name("itlaudit")), "bisect",
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 7, "cap"),
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pgid = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                state = _state(out)
            except (OSError, ValueError):
                state = {}
            pending = (state.get("in_progress") or [{}])[0]
            if len(state.get("probes", [])) >= 2 and pending.get("server_pgid"):
                pgid = pending["server_pgid"]
                break
            time.sleep(0.05)
        assert pgid is not None, "the bisection never reached its third probe"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert _group_alive(pgid), "the killed run's server outlives it (it is in its own session)"
        cut_short = Path(_state(out)["in_progress"][0]["dir"])
        assert _bisect(monkeypatch, "--resume", str(out)) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if pgid is not None and _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail("resume did not stop the server the killed run left behind")
    state = _state(out)
    assert state["first_bad"] == shas[7] and state["in_progress"] == []
    assert cut_short.with_name(cut_short.name + ".interrupted-1").is_dir()
    assert (cut_short / "server-build.log").is_file()  # the probe was rerun in its own folder
    assert len({p["index"] for p in state["probes"]}) == len(state["probes"])


def test_report_says_why_it_moved_at_the_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the culprit on the server's KV cache is tiny (it preempts): the report lists the server
    signals that changed between the last good and the first bad build's probes (as `diff` does)."""
    shas = _commits(tmp_path / "commits.txt", 6)
    out = tmp_path / "bisect"
    code = _bisect(
        monkeypatch,
        "--from", shas[0], "--to", shas[-1], "--commits-file", str(tmp_path / "commits.txt"),
        *_args(tmp_path / "commits.txt", 3, "cap-kv"),
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    assert _state(out)["first_bad"] == shas[3]
    report = (out / "report.md").read_text()
    section = report.split("### Why it moved", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| build |")]
    preempted = [row for row in rows if "| preemptions | 0 |" in row]
    assert preempted and int(preempted[0].split("|")[4]) > 0, section
