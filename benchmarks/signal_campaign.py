"""Signals at random times, as a script sends them (issue 39 item 1's campaign): each case starts an
itlaudit command as a background job of a non-interactive shell (which inherits SIGINT ignored),
sleeps a random 0.1-T s, sends SIGINT or SIGTERM, and grades what happened:

- lost: the signal was delivered (kill succeeded) and the command did not exit with its code (130
  for SIGINT, 143 for SIGTERM): it ran on to 0, or to nightly's 125;
- slow: it exited more than 5 s after the signal;
- traceback: "Traceback" on its stderr;
- left: a process it started (server, capture worker) still alive 3 s after it exited;
- unmarked: a run folder with records but neither summary.json nor an interrupted/failed mark.

A case whose command ended before its signal is "finished first" (kill found no process): not graded.
Commands: run and compare (launched simulators), sweep (a launched simulator, two loads), smoke (the
simulator suite, --launch), bisect and track nightly (tests/fixtures/bisect/fake_vllm.py as the command
provider; nightly probes three new builds into a fresh SQLite history).

    python benchmarks/signal_campaign.py [--cases 100] [--max-delay 10] [--seed 0] [--only run,sweep]
                                         [--rerun 14,15]

Prints one line a case and the totals; exits 1 when any case failed a grade.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM = [sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "20", "--ttft-ms", "5"]
WORKLOAD = 'prompts = ["hi"]\nnum_requests = {n}\nconcurrency = 2\nmax_tokens = 20\ntemperature = 0\n'
FAKE_VLLM = ROOT / "tests" / "fixtures" / "bisect" / "fake_vllm.py"
PROBE_SCENARIO = ROOT / "tests" / "fixtures" / "bisect" / "probe.toml"

SCRIPT = """
{command} >"$CASE/stdout" 2>"$CASE/stderr" &
pid=$!
sleep {delay}
start=$(date +%s%N)
if kill -{signal} $pid 2>/dev/null; then sent=1; else sent=0; fi
wait $pid
rc=$?
echo "$sent $rc $(( ($(date +%s%N) - start) / 1000000 ))"
"""


def _scenario(folder: Path, names: list[str], requests: int) -> Path:
    text = f'name = "signals"\n[workload]\n{WORKLOAD.format(n=requests)}'
    launch = f'[variants.launch]\nkind = "command"\ncommand = {json.dumps(SIM)}\n'
    for name in names:
        text += f'[[variants]]\nname = "{name}"\n{launch}'
    path = folder / "s.toml"
    path.write_text(text)
    return path


def _builds(folder: Path) -> tuple[list[str], list[str]]:
    """(12 commit shas, the provider options that serve them): fake vLLM builds, capped from the 8th."""
    shas = [os.urandom(20).hex() for _ in range(12)]
    commits = folder / "commits.txt"
    commits.write_text("".join(f"{sha}\n" for sha in shas))
    server = (
        f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from 7 --mode cap {{commit}} {{port}}"
    )
    return shas, [
        "--commits-file", str(commits), "--provider", "command", "--server-cmd", server,
        "--ready-timeout", "30", "--scenario", str(PROBE_SCENARIO),
    ]  # fmt: skip


def _bisect_args(folder: Path) -> list[str]:
    shas, provider = _builds(folder)
    return ["bisect", "--from", shas[0], "--to", shas[-1], *provider, "--regress", "truncation"]


def _nightly_args(folder: Path) -> list[str]:
    """Six new builds into a fresh SQLite history, each probed, recorded, then all checked (~9 s)."""
    _, provider = _builds(folder)
    return ["track", "nightly", "--db", str(folder / "history.sqlite"), "--last", "6", *provider]


COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "run": lambda f: ["run", str(_scenario(f, ["A"], 60))],
    "compare": lambda f: ["compare", str(_scenario(f, ["K0", "K3"], 30))],
    "sweep": lambda f: ["sweep", str(_scenario(f, ["A"], 30)), "--concurrency", "1,2"],
    "smoke": lambda f: [
        "smoke",
        "--suite",
        str(ROOT / "scenarios" / "smoke" / "sim"),
        "--launch",
        "command:{python} -m itlaudit sim --port {port} --ttft-ms 5",
    ],
    "bisect": _bisect_args,
    "nightly": _nightly_args,
}


def marked_processes(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries the marker: the command and everything it
    started (servers, the forkserver, capture workers) inherit it (tests/test_signals.py too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            tagged = marker.encode() in (entry / "environ").read_bytes().split(b"\0")
            if tagged and (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _unmarked(out: Path) -> list[str]:
    """Run folders under `out` with records but neither a summary nor an interrupted/failed mark."""
    bad = []
    for requests in out.rglob("requests.jsonl"):
        folder = requests.parent
        if not requests.read_text().strip() or (folder / "summary.json").is_file():
            continue
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        if not (meta.get("interrupted") or meta.get("failed")) and ".incomplete-" not in folder.name:
            bad.append(str(folder.relative_to(out)))
    return bad


def run_case(number: int, command: str, delay: float, signal: str, work: Path) -> tuple[str, list[str]]:
    case = work / f"case-{number:03d}-{command}"
    case.mkdir()
    marker = f"ITLAUDIT_SIGNAL_CAMPAIGN={uuid.uuid4()}"
    name, value = marker.split("=", 1)
    argv = [sys.executable, "-m", "itlaudit", *COMMANDS[command](case)]
    line = shlex.join(argv) + f" --out {shlex.quote(str(case / 'out'))}"
    done = subprocess.run(
        ["bash", "-c", SCRIPT.format(command=line, delay=f"{delay:.2f}", signal=signal)],
        cwd=case,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CASE": str(case), name: value},
    )
    sent, rc, elapsed_ms = (int(word) for word in done.stdout.split())
    deadline = time.monotonic() + 3
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    stderr = (case / "stderr").read_text(errors="replace")
    failed = []
    if not sent:
        return "finished first", failed
    if rc != {"INT": 130, "TERM": 143}[signal]:
        failed.append(f"lost (rc {rc})")
    if elapsed_ms > 5000:
        failed.append(f"slow ({elapsed_ms} ms)")
    if "Traceback" in stderr:
        failed.append("traceback")
    if left:
        failed.append(f"left {len(left)}")
        for pid in left:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    if (case / "out").is_dir() and (bad := _unmarked(case / "out")):
        failed.append(f"unmarked {bad}")
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"rc {rc} in {elapsed_ms} ms: {last[:100]}", failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--max-delay", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(COMMANDS), help="commands, comma-separated")
    parser.add_argument(
        "--rerun", default="", help="case numbers of the seed's round to run again, alone (e.g. 14,15)"
    )
    args = parser.parse_args()
    chosen = [c for c in args.only.split(",") if c]
    rng = random.Random(args.seed)
    rerun = {int(n) for n in args.rerun.split(",") if n}
    totals: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="signals-") as tmp:
        for number in range(args.cases):
            command = rng.choice(chosen)
            delay = rng.uniform(0.1, args.max_delay)
            signal = rng.choice(["INT", "TERM"])
            if rerun and number not in rerun:
                continue  # the same draws as the round, so a case keeps its command, moment and signal
            outcome, failed = run_case(number, command, delay, signal, Path(tmp))
            totals["cases"] += 1
            totals["finished first" if outcome == "finished first" else "graded"] += 1
            for grade in failed:
                totals[grade.split(" ")[0]] += 1
            verdict = "FAIL " + ", ".join(failed) if failed else "ok"
            print(
                f"{number:3d} {command:8s} SIG{signal:4s} at {delay:5.2f} s: {verdict}; {outcome}", flush=True
            )
    print("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    bad = sum(totals[k] for k in ("lost", "slow", "traceback", "left", "unmarked"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
