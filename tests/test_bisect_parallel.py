"""`bisect --parallel K`: K builds a round at the points that cut the range into K + 1 equal parts, each
probe on its own GPU, so the answer comes in about log_(K+1) N rounds; rounds are counted, not timed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from itlaudit import cli
from itlaudit.bisect import state as state_mod
from itlaudit.bisect.search import Answer, Search

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM, PROBE_SCENARIO, make_repo

PY = sys.executable


def _rounds(size: int, first_bad: int, k: int, unknown: frozenset[int] = frozenset()) -> tuple[Search, int]:
    """Rounds the search needs between the two end checks, answering as a build at `first_bad` would."""
    search = Search(size)
    rounds = 0
    probed: set[int] = set()
    while indices := search.next_round(k):
        assert len(indices) <= k and not probed & set(indices), "a build is never probed twice"
        probed |= set(indices)
        rounds += 1
        for index in indices:
            answer = Answer.UNKNOWN if index in unknown else Answer.YES if index >= first_bad else Answer.NO
            search.record(index, answer)
    return search, rounds


def test_split_points_cut_the_range_into_equal_parts() -> None:
    assert Search(130).next_round(3) == [32, 64, 97]
    assert Search(130).next_round(1) == [64]  # k = 1 is the binary search's midpoint
    search = Search(10)
    search.record(4, Answer.YES)
    assert search.next_round(3) == [1, 2, 3]  # no more open builds than probes: all of them
    search = Search(130)
    search.record(64, Answer.UNKNOWN)
    assert search.next_round(3) == [32, 65, 97]  # an answered point moves to its nearest open build


@pytest.mark.parametrize("k", [2, 3, 7])
def test_every_culprit_found_in_log_k_plus_1_rounds_and_fewer_than_sequential(k: int) -> None:
    size = 130
    bound = math.ceil(math.log(size, k + 1))
    for first_bad in range(1, size):
        search, rounds = _rounds(size, first_bad, k)
        assert search.candidates == [first_bad]
        assert rounds <= bound
        assert rounds < _rounds(size, first_bad, 1)[1]


def test_unknowns_are_stepped_around_and_an_unclear_range_stays_honest() -> None:
    search, _ = _rounds(130, 97, 3, frozenset(range(60, 70)))
    assert search.candidates == [97]
    search, _ = _rounds(12, 7, 3, frozenset({6, 7}))
    assert search.candidates == [6, 7, 8]


def test_a_format_2_state_resumes() -> None:
    pending = {"index": 3, "ref": "abc", "dir": "/x"}
    assert state_mod._as_list(pending) == [pending]
    assert state_mod._as_list(None) == []


def test_parallel_3_over_130_commits_finds_the_culprit_in_fewer_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = make_repo(tmp_path / "vllm", 130)
    culprit = 83
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{s}\n" for s in shas))
    # The server says which GPU it was given, so the log shows each probe had its own.
    wrapper = tmp_path / "gpu_echo.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "print('CUDA_VISIBLE_DEVICES=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), flush=True)\n"
        f"sys.argv[0] = {str(FAKE_VLLM)!r}\n"
        f"runpy.run_path({str(FAKE_VLLM)!r}, run_name='__main__')\n"
    )
    server = f"{PY} {wrapper} serve --commits {commits} --bad-from {culprit} --mode cap {{commit}} {{port}}"
    out = tmp_path / "bisect"
    monkeypatch.setattr(sys, "argv", [
        "itlaudit", "bisect", "--from", shas[0][:9], "--to", shas[-1][:9], "--repo", str(tmp_path / "vllm"),
        "--provider", "command", "--server-cmd", server, "--ready-timeout", "30",
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
        "--cache-dir", str(tmp_path / "cache"), "--parallel", "3",
    ])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 0
    state = json.loads((out / "bisect.json").read_text())
    assert state["status"] == "done" and state["in_progress"] == []
    assert state["first_bad"] == shas[culprit] and state["last_good"] == shas[culprit - 1]
    sequential = _rounds(len(shas), culprit, 1)[1] + 2  # one probe a round, the two ends included
    assert state["rounds_used"] <= math.ceil(math.log(len(shas), 4)) + 2
    assert state["rounds_used"] < sequential
    rounds: dict[int, list[dict]] = {}
    for probe in state["probes"]:
        rounds.setdefault(probe["round"], []).append(probe)
        assert probe["verdict"] == ("bad" if probe["index"] >= culprit else "good")
        log = (Path(probe["dir"]) / "server-build.log").read_text()
        assert f"CUDA_VISIBLE_DEVICES={probe['gpu']}" in log
    assert sorted(rounds) == list(range(1, state["rounds_used"] + 1))
    assert [len(p) for p in rounds.values()][:3] == [1, 1, 3]  # the good end, the bad end, then 3 a round
    for probes in rounds.values():
        assert sorted(p["gpu"] for p in probes) == [str(g) for g in range(len(probes))]
    report = (out / "report.md").read_text()
    assert f"{len(state['probes'])} probes in {state['rounds_used']} rounds (up to 3 at once)" in report
