"""`itlaudit bisect --resume` on a bisect.json it cannot trust (fault campaign row N28), and on one a
SIGKILL left mid-run (row 29). The bisections are real: the `command` provider starts the simulator as
"vLLM at commit X" with output capped from commit 7 on, as tests/test_bisect_e2e.py does.

A truncated, self-contradicting or foreign file is one line, exit 2, and every byte of the folder left
as it was; a killed bisection resumed gives the uninterrupted one's answer and verdicts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simkit import itlaudit

from itlaudit.bisect import state as state_mod
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers.command import CommandOptions
from itlaudit.bisect.search import Search
from itlaudit.bisect.settings import ProbeSetup, Settings
from itlaudit.bisect.state import State
from itlaudit.errors import BisectError

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM, PROBE_SCENARIO

CULPRIT = 7
COUNT = 12


def _command(tmp_path: Path) -> tuple[list[str], list[str]]:
    """(shas, the bisect arguments before --out): 12 commits, capped output from CULPRIT on."""
    shas = [os.urandom(20).hex() for _ in range(COUNT)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{s}\n" for s in shas))
    server = f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from {CULPRIT} --mode cap"
    args = ["bisect", "--from", shas[0], "--to", shas[-1], "--commits-file", str(commits)]
    args += ["--provider", "command", "--server-cmd", server + " {commit} {port}", "--ready-timeout", "30"]
    args += ["--scenario", str(PROBE_SCENARIO), "--regress", "truncation"]
    return shas, args


def _state(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / "bisect.json").read_text())
    return loaded


def _answer(state: dict[str, Any]) -> tuple[Any, ...]:
    """What a bisection found, without its timings: the answer and each build's verdict."""
    verdicts = sorted((p["index"], p["verdict"]) for p in state["probes"])
    return state["first_bad"], state["last_good"], state["candidates"], verdicts


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], Path]:
    """An uninterrupted bisection: (shas, its arguments, its folder)."""
    tmp = tmp_path_factory.mktemp("whole")
    shas, args = _command(tmp)
    done = itlaudit(*args, "--out", str(tmp / "b"))
    assert done.returncode == 0, done.stderr
    assert _state(tmp / "b")["first_bad"] == shas[CULPRIT]
    return shas, args, tmp / "b"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _unfinished(done: Path, folder: Path) -> dict[str, Any]:
    """A copy of the finished bisection in `folder` as it stood before its last probe: running, that
    probe not yet done (its folder gone); the state is returned, for the caller to write (or edit)."""
    shutil.copytree(done, folder)
    state = _state(done)
    shutil.rmtree(folder / Path(state["probes"][-1]["dir"]).name)
    probes = [{**p, "dir": str(folder / Path(p["dir"]).name)} for p in state["probes"][:-1]]
    keep = ("format", "in_progress", "settings", "builds")
    return {**{k: state[k] for k in keep}, "status": "running", "probes": probes}


def _mid(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The probes the search chose (the ends are checked first, not searched)."""
    return [p for p in state["probes"] if p["index"] not in (0, COUNT - 1)]


def _flip_first_mid(state: dict[str, Any]) -> None:
    """A probe good above a bad one: the first searched probe's verdict turned over, with the later
    probes still where the search put them under the old verdict."""
    first = _mid(state)[0]
    first["verdict"] = {"good": "bad", "bad": "good"}[first["verdict"]]


def _edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[str], str]:
    def apply(text: str) -> str:
        state = json.loads(text)
        change(state)
        return json.dumps(state, indent=2)

    return apply


def _swap_builds(state: dict[str, Any]) -> None:
    state["builds"][_mid(state)[0]["index"]]["ref"] = "f" * 40  # a build list from another range


TAMPERED: dict[str, tuple[Callable[[str], str], str]] = {
    "truncated": (lambda text: text[: len(text) // 2], "cannot read bisect.json"),
    "empty": (lambda text: "", "cannot read bisect.json"),
    "a list": (lambda text: "[]", "holds a list, not a bisection"),
    "no builds": (_edit(lambda s: s.pop("builds")), "has no 'builds'"),
    "no settings": (_edit(lambda s: s.pop("settings")), "has no 'settings'"),
    "a build without kind": (_edit(lambda s: s["builds"][3].pop("kind")), "settings or builds do not read"),
    "a probe without verdict": (_edit(lambda s: _mid(s)[0].pop("verdict")), "without 'verdict'"),
    "an unknown verdict": (
        _edit(lambda s: _mid(s)[0].update(verdict="meh")),
        "with verdict 'meh' (known: good, bad, skip, unknown)",
    ),
    "good above bad": (_edit(_flip_first_mid), "contradicts itself"),
    "a build probed twice": (_edit(lambda s: s["probes"].append(s["probes"][-1])), "probed twice"),
    "a probe outside the range": (_edit(lambda s: _mid(s)[0].update(index=40)), "outside the 12 builds"),
    "another range": (_edit(_swap_builds), "another range"),
    "a folder elsewhere": (
        _edit(lambda s: s["in_progress"].append({"index": 5, "ref": s["builds"][5]["ref"], "dir": "/tmp/x"})),
        "whose folder /tmp/x is not in",
    ),
    "an unknown status": (_edit(lambda s: s.update(status="paused")), "has status 'paused'"),
    "settings that do not hold": (
        _edit(lambda s: s["settings"].update(threshold=0.5)),
        "its settings do not hold (--threshold 0.5",
    ),
}


@pytest.mark.fault_row("N28")
@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_bisect_json_is_one_line_and_nothing_is_overwritten(
    whole: tuple[list[str], list[str], Path], tmp_path: Path, case: str
) -> None:
    _, _, done = whole
    folder = tmp_path / "b"
    text = json.dumps(_unfinished(done, folder), indent=2)
    tamper, needle = TAMPERED[case]
    (folder / "bisect.json").write_text(tamper(text))
    before = _files(folder)
    result = itlaudit("bisect", "--resume", str(folder))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("itlaudit: error: ") and needle in line, line
    assert _files(folder) == before


@pytest.mark.fault_row("N28")
def test_an_untampered_unfinished_bisect_json_resumes_to_the_same_answer(
    whole: tuple[list[str], list[str], Path], tmp_path: Path
) -> None:
    """The clean neighbour of the tampered files: the same copy, unedited, resumes and finishes."""
    _, args, done = whole
    folder = tmp_path / "b"
    (folder / "bisect.json").write_text(json.dumps(_unfinished(done, folder), indent=2))
    given = args[args.index("--from") : args.index("--from") + 4]  # the same --from/--to: accepted
    result = itlaudit("bisect", "--resume", str(folder), *given)
    assert result.returncode == 0, result.stderr
    assert _answer(_state(folder)) == _answer(_state(done))


@pytest.mark.fault_row("N28")
@pytest.mark.parametrize("flag", ["--from", "--to"])
def test_resume_with_another_from_or_to_is_one_line(
    whole: tuple[list[str], list[str], Path], tmp_path: Path, flag: str
) -> None:
    shas, _, done = whole
    folder = tmp_path / "b"
    (folder / "bisect.json").write_text(json.dumps(_unfinished(done, folder), indent=2))
    before = _files(folder)
    other = shas[3] if flag == "--from" else shas[9]
    result = itlaudit("bisect", "--resume", str(folder), flag, other[:9])
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"bisects {shas[0]}..{shas[-1]}, not {flag} {other[:9]}" in line
    assert "drop --from/--to" in line
    assert _files(folder) == before


@pytest.mark.fault_row("N28")
def test_resume_with_other_options_names_them_in_one_line(
    whole: tuple[list[str], list[str], Path], tmp_path: Path
) -> None:
    """Options other than the range were ignored by --resume without a word (issue 39 item 5): each
    is named with the value the bisection was started with; the credentials, never stored, may come
    again (the clean neighbour above resumes with --from/--to). ~2 s."""
    _, _, done = whole
    folder = tmp_path / "b"
    (folder / "bisect.json").write_text(json.dumps(_unfinished(done, folder), indent=2))
    before = _files(folder)
    threshold = _state(folder)["settings"]["threshold"]
    result = itlaudit(
        "bisect", "--resume", str(folder), "--threshold", "3", "--trials", "2", "--api-key", "k"
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"not --threshold (started with {threshold!r}), --trials (started with" in line
    assert "--api-key" not in line and "start a new bisection with a new --out" in line
    assert _files(folder) == before


@pytest.mark.fault_row("29")
def test_sigkill_then_resume_gives_the_uninterrupted_answer(
    whole: tuple[list[str], list[str], Path], tmp_path: Path
) -> None:
    """Killed as its fourth probe is marked in progress (before its server is up), then resumed."""
    _, args, done = whole
    out = tmp_path / "b"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("itlaudit")), *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                state = _state(out)
            except (OSError, ValueError):
                state = {}
            if len(state.get("probes", [])) >= 3 and state.get("in_progress"):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = _state(out)
    assert len(killed["probes"]) >= 3 and killed["in_progress"], "the bisection never reached its 4th probe"
    resumed = itlaudit("bisect", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    state = _state(out)
    assert state["status"] == "done" and state["in_progress"] == []
    assert _answer(state) == _answer(_state(done))
    assert state["probes"][: len(killed["probes"])] == killed["probes"]  # finished probes kept, not rerun


def _parallel_state(folder: Path, flaky: int) -> State:
    """A --parallel 3 bisection of 40 builds (culprit 23) as the search runs it, with build `flaky`
    answering the wrong way in its round: verdicts that disagree within a round are the noise a real
    run can give, not an edit."""
    builds = [Build(ref=f"{n:040x}", kind="commit") for n in range(40)]
    setup = ProbeSetup(provider=CommandOptions(server_cmd="s {port}"))
    settings = Settings(good=builds[0].ref, bad=builds[-1].ref, setup=setup)
    state = State(settings=settings, builds=builds)
    search = Search(len(builds))

    def verdict(index: int) -> str:
        return "bad" if (index >= 23) != (index == flaky) else "good"

    rounds = [[0], [len(builds) - 1]]
    while indices := search.next_round(3):
        rounds.append(indices)
        for index in indices:
            search.record(index, state_mod.answer(verdict(index), find_fix=False))
    for number, indices in enumerate(rounds, 1):
        for index in indices:
            build, probe_dir = builds[index], str(folder / f"probe-{len(state.probes) + 1:02d}")
            state.probes.append(
                {"index": index, "build": build.ref, "label": build.label, "verdict": verdict(index)}
                | {"reason": "", "dir": probe_dir, "round": number}
            )
    return state


@pytest.mark.fault_row("N28")
def test_a_parallel_rounds_disagreeing_verdicts_resume_but_an_edit_across_rounds_does_not(
    tmp_path: Path,
) -> None:
    state = _parallel_state(tmp_path, flaky=10)
    third = [p for p in state.probes if p["round"] == 3]
    # The search's first points 10, 20, 29: 10 answered bad below 20 good, noise within one round.
    assert [(p["index"], p["verdict"]) for p in third] == [(10, "bad"), (20, "good"), (29, "bad")]
    state.save(tmp_path)
    assert state_mod.load(tmp_path).probes == state.probes
    third[2]["verdict"] = "good"  # round 4 then probed between 20 and 29, below a good build
    state.save(tmp_path)
    with pytest.raises(BisectError, match=r"contradicts itself: probe of 000000000 .* a verdict was changed"):
        state_mod.load(tmp_path)
