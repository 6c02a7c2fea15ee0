"""Signals as a script sends them: `itlaudit run … &` from a non-interactive shell, whose background jobs
inherit SIGINT ignored, then `kill -TERM $!` (or -INT). The run must end within seconds with 143 (130),
keep what finished (summary and report written), and leave no process behind: not a launched server,
not a capture worker. Faults campaign 2026-12-04, rows 24 and N4."""

from __future__ import annotations

import json
import os
import shlex
import signal as signal_module
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from faultkit import url_variant, write_scenario
from signal_campaign import marked_processes

from itlaudit.report.markdown import escape

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM, PROBE_SCENARIO

# The shell script: start the command in the background, wait for its first records, signal it, and
# report its exit code and how long it took to exit after the signal (ms).
SCRIPT = """
{command} >"$OUT_DIR/stdout" 2>"$OUT_DIR/stderr" &
pid=$!
for _ in $(seq 600); do for f in "$OUT_DIR"/run/{wait}; do [ -s "$f" ] && break 2; done; sleep 0.1; done
grep SigIgn /proc/self/status >"$OUT_DIR/sigign" & wait $!
start=$(date +%s%N)
kill -{signal} $pid
wait $pid
rc=$?
echo "$rc $(( ($(date +%s%N) - start) / 1000000 ))"
"""


def _background(
    tmp_path: Path, args: list[str], signal: str, wait: str = "requests.jsonl"
) -> tuple[int, int, str]:
    """(exit code, ms from the signal to the exit, stderr) of `itlaudit ARGS` as a script's background
    job, signalled once `wait` (a glob under its --out) holds a record; asserts that SIGINT was ignored
    in it and that nothing it started outlives it."""
    marker = f"ITLAUDIT_SIGNAL_TEST={uuid.uuid4()}"
    command = shlex.join([sys.executable, "-m", "itlaudit", *args]) + ' --out "$OUT_DIR/run"'
    name, value = marker.split("=", 1)
    result = subprocess.run(
        ["bash", "-c", SCRIPT.format(command=command, signal=signal, wait=wait)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OUT_DIR": str(tmp_path), name: value},
    )
    assert result.returncode == 0, result.stderr
    code, elapsed_ms = (int(word) for word in result.stdout.split())
    ignored = int((tmp_path / "sigign").read_text().split()[1], 16)
    assert ignored & (1 << (2 - 1)), "this shell's background jobs should inherit SIGINT ignored"
    deadline = time.monotonic() + 3  # the forkserver notices its parent's exit on its next wakeup
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    return code, elapsed_ms, (tmp_path / "stderr").read_text()


def _kept(run: Path, stderr: str, signal: str) -> None:
    """What finished is kept: one interrupted line last, the summary and report for those requests."""
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"itlaudit: interrupted by SIG{signal}: "), stderr
    kept = len((run / "requests.jsonl").read_text().splitlines())
    assert kept >= 1 and f"{kept} finished requests kept" in last
    summary = json.loads((run / "summary.json").read_text())
    assert sum(block["requests"] for block in summary["variants"].values()) == kept
    # the plots (seconds on a loaded box) are left to the command the report names
    said = escape(f"not drawn: interrupted; `itlaudit report {run}` draws them")
    assert f"**plots**: {said}" in (run / "report.md").read_text()
    assert list(run.glob("*.png")) == []
    assert "writing the report…" in stderr.splitlines() and "drawing the plots" not in stderr  # nor says so
    assert json.loads((run / "meta.json").read_text())["interrupted"]["signal"] == f"SIG{signal}"


@pytest.mark.fault_row("N4")
@pytest.mark.parametrize(("signal", "code"), [("TERM", 143), ("INT", 130)])
def test_signal_ends_a_scripts_background_run(faultserver, tmp_path: Path, signal: str, code: int) -> None:
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 200\nconcurrency = 2\nmax_tokens = 20\ntemperature = 0'
    scenario = write_scenario(tmp_path, url_variant("A", url), workload)
    rc, elapsed_ms, stderr = _background(tmp_path, ["run", str(scenario)], signal)
    assert rc == code, stderr
    assert elapsed_ms < 5000, f"exited {elapsed_ms} ms after SIG{signal}"
    _kept(tmp_path / "run", stderr, signal)


@pytest.mark.fault_row("24")
def test_sigterm_ends_a_scripts_background_compare_and_its_launched_servers(tmp_path: Path) -> None:
    sim = json.dumps([sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "30"])
    variants = "".join(
        f'[[variants]]\nname = "{name}"\n\n[variants.launch]\nkind = "command"\ncommand = {sim}\n\n'
        for name in ("K0", "K3")
    )
    workload = 'prompts = ["hi"]\nnum_requests = 200\nconcurrency = 2\nmax_tokens = 20\ntemperature = 0'
    scenario = write_scenario(tmp_path, variants, workload)
    rc, elapsed_ms, stderr = _background(tmp_path, ["compare", str(scenario)], "TERM")
    assert rc == 143, stderr
    assert elapsed_ms < 5000, f"exited {elapsed_ms} ms after SIGTERM"
    _kept(tmp_path / "run", stderr, "TERM")
    assert not (tmp_path / "run" / "compare.json").exists()  # the compare itself never finished


# A launched server that ignores SIGTERM, as a vLLM stuck in its shutdown may: the group's leader and
# its "engine core" child (the sleep) ignore it; the simulator the leader runs serves the run.
STUBBORN = (
    "import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "subprocess.run([sys.executable, '-m', 'itlaudit', 'sim', '--port', sys.argv[1], '--step-ms', '30']); "
    "signal.pause()"
)


@pytest.mark.fault_row("R14")
def test_sigterm_ends_a_run_whose_launched_server_ignores_it(tmp_path: Path) -> None:
    """The launcher gave a server 10 s after its SIGTERM before the SIGKILL, so a server that ignores
    it held a signalled run's exit past the 5 s bound. After a signal the grace is what is left of
    model.stop.SIGNALLED_GRACE_S, then the whole group is killed: 143 within 5 s, nothing left.
    ~4 s."""
    command = json.dumps([sys.executable, "-c", STUBBORN, "{port}"])
    variant = f'[[variants]]\nname = "A"\n\n[variants.launch]\nkind = "command"\ncommand = {command}\n'
    workload = 'prompts = ["hi"]\nnum_requests = 200\nconcurrency = 2\nmax_tokens = 20\ntemperature = 0'
    scenario = write_scenario(tmp_path, variant, workload)
    rc, elapsed_ms, stderr = _background(tmp_path, ["run", str(scenario)], "TERM")
    assert rc == 143, stderr
    assert elapsed_ms < 5000, f"exited {elapsed_ms} ms after SIGTERM"
    _kept(tmp_path / "run", stderr, "TERM")


def test_sigterm_ends_a_scripts_background_bisect_with_its_report(tmp_path: Path) -> None:
    shas = [os.urandom(20).hex() for _ in range(12)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{sha}\n" for sha in shas))
    server = f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from 7 --mode cap"
    server += " {commit} {port}"
    args = ["bisect", "--from", shas[0], "--to", shas[-1], "--commits-file", str(commits)]
    args += ["--provider", "command", "--server-cmd", server, "--ready-timeout", "30"]
    args += ["--scenario", str(PROBE_SCENARIO), "--regress", "truncation"]
    rc, elapsed_ms, stderr = _background(tmp_path, args, "TERM", wait="probe-*/trial-1/requests.jsonl")
    assert rc == 143, stderr
    assert elapsed_ms < 5000, f"exited {elapsed_ms} ms after SIGTERM"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("itlaudit: interrupted by SIGTERM; finished probes are in "), stderr
    assert "itlaudit bisect --resume " in last and "Traceback" not in stderr
    assert (tmp_path / "run" / "report.md").is_file()
    _finished_or_marked(tmp_path / "run", "probe-*/trial-*", "summary.json")


@pytest.mark.fault_row("R13")
def test_an_interrupted_nightly_names_itself_and_its_rerun_probes_the_build_again(tmp_path: Path) -> None:
    """A nightly's probe a signal cut said to finish it with "the bisection's --resume" (no bisection
    is there), and running the nightly again appended the build's next probe to the cut trial's
    records. The mark now names `track nightly`, and a rerun sets the cut folder aside and probes the
    build whole. ~15 s."""
    shas = [os.urandom(20).hex() for _ in range(4)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{sha}\n" for sha in shas))
    server = f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from 9 --mode cap"
    server += " {commit} {port}"
    args = ["track", "nightly", "--db", str(tmp_path / "h.sqlite"), "--last", "2", "--commits-file"]
    args += [str(commits), "--provider", "command", "--server-cmd", server, "--ready-timeout", "30"]
    scenario = tmp_path / "probe.toml"  # long enough that the signal lands inside the first trial
    scenario.write_text(PROBE_SCENARIO.read_text().replace("num_requests = 2", "num_requests = 20"))
    args += ["--scenario", str(scenario)]
    rc, _, stderr = _background(tmp_path, args, "TERM", wait="build-*/trial-1/requests.jsonl")
    assert rc == 143 and "Traceback" not in stderr, stderr
    cut = next((tmp_path / "run").glob("build-*/trial-1"))
    mark = json.loads((cut / "meta.json").read_text())["interrupted"]
    assert mark["finish_with"].startswith("`itlaudit track nightly` run again"), mark
    again = subprocess.run(
        [sys.executable, "-m", "itlaudit", *args, "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    kept = cut.parent.with_name(f"{cut.parent.name}.interrupted-1") / "trial-1"
    assert json.loads((kept / "meta.json").read_text())["interrupted"] == mark  # set aside, untouched
    assert "interrupted" not in json.loads((cut / "meta.json").read_text())
    assert len((cut / "requests.jsonl").read_text().splitlines()) == 20  # the whole probe, once


def test_sigterm_ends_a_scripts_background_sweep_with_its_outputs(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 100\nconcurrency = 1\nmax_tokens = 20\ntemperature = 0'
    scenario = write_scenario(tmp_path, url_variant("A", url), workload)
    args = ["sweep", str(scenario), "--concurrency", "1,2"]
    rc, elapsed_ms, stderr = _background(tmp_path, args, "TERM", wait="A/c1-t1/requests.jsonl")
    assert rc == 143, stderr
    assert elapsed_ms < 5000, f"exited {elapsed_ms} ms after SIGTERM"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("itlaudit: interrupted by SIGTERM: finished points kept in "), stderr
    assert "(plots not drawn)" in last and list((tmp_path / "run").glob("*.png")) == []
    assert "--resume" in last and "Traceback" not in stderr
    assert (tmp_path / "run" / "sweep.json").is_file() and (tmp_path / "run" / "report.md").is_file()
    _finished_or_marked(tmp_path / "run", "A/c*-t*", "point.json")


def _finished_or_marked(out: Path, trials: str, finished: str) -> None:
    """Every trial folder the signal left is finished (`finished` written) or marked interrupted with
    what finishes it: no reader may take a cut trial's records for a run (the signal campaign's find,
    benchmarks/signal_campaign.py)."""
    folders = [f for f in out.glob(trials) if f.is_dir()]
    assert folders
    for folder in folders:
        if not (folder / finished).is_file():
            mark = json.loads((folder / "meta.json").read_text())["interrupted"]
            assert mark["finish_with"].endswith(
                "--resume, which runs this " + ("trial" if finished == "point.json" else "probe") + " again"
            ), mark


# A run in a fresh interpreter (the handlers are the CLI's, and a second signal ends the process)
# against an in-process simulator, with `signals` SIGTERMs sent to itself as its derivation starts
# (RunFolder.finish wrapped): the moment the fault campaign's 15 runs lost.
DERIVE_TEXT = (
    'name = "held"\n[workload]\nprompts = ["hi"]\nnum_requests = 2\nmax_tokens = 4\n'
    '[[variants]]\nname = "A"\n'
)
DERIVING = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from simkit import sim_server
from itlaudit.errors import RunInterrupted
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.stop import handle_signals
from itlaudit.serve.sim import SimConfig
from itlaudit.workflows.run import run_scenario
from itlaudit.workflows.run_folder import RunFolder
real = RunFolder.finish
def signalled(self, *args, **kwargs):
    for _ in range({signals}):
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, *args, **kwargs)
RunFolder.finish = signalled
handle_signals()
with sim_server(SimConfig(step_ms=0, ttft_ms=0)) as url:
    try:
        run_scenario(parse_scenario({text!r}, Path({scenario!r})), url=url, run_dir=Path({run_dir!r}))
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)
"""


def _run_signalled_in_derivation(tmp_path: Path, signals: int) -> tuple[Path, str]:
    """(the run folder, the last stderr line) of a run sent `signals` SIGTERMs as it derives; 143."""
    run_dir = tmp_path / "run"
    tests, scenario = str(Path(__file__).parent), str(tmp_path / "held.toml")
    script = DERIVING.format(
        tests=tests, signals=signals, text=DERIVE_TEXT, scenario=scenario, run_dir=str(run_dir)
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return run_dir, done.stderr.strip().splitlines()[-1]


@pytest.mark.fault_row("R11")
def test_a_signal_while_deriving_is_held_until_the_figures_are_written(tmp_path: Path) -> None:
    """One SIGTERM as the derivation starts: held, the summary and report are written, then the run
    stops with 143 and says so; the folder is finished, not marked. ~3 s."""
    run_dir, last = _run_signalled_in_derivation(tmp_path, signals=1)
    assert last.startswith("interrupted by SIGTERM after the last request: its figures were finished"), last
    assert (run_dir / "summary.json").is_file() and (run_dir / "report.md").is_file()
    assert "interrupted" not in json.loads((run_dir / "meta.json").read_text())


@pytest.mark.fault_row("R11")
def test_a_second_signal_cuts_the_derivation_and_names_the_command_that_finishes_it(tmp_path: Path) -> None:
    """Two SIGTERMs: the user will not wait; the process ends at once from the second's handler, the
    records stay, meta.json is marked with the command that derives the figures, and that command
    does. ~5 s."""
    run_dir, last = _run_signalled_in_derivation(tmp_path, signals=2)
    hint = f"`itlaudit report {run_dir}` derives its figures"
    said = "itlaudit: interrupted by SIGTERM while deriving the figures: every request is kept; "
    assert last == said + hint
    mark = json.loads((run_dir / "meta.json").read_text())["interrupted"]
    assert mark["signal"] == "SIGTERM" and mark["finish_with"] == hint
    assert not (run_dir / "summary.json").exists()
    assert len((run_dir / "requests.jsonl").read_text().splitlines()) == 2
    report = [sys.executable, "-m", "itlaudit", "report", str(run_dir)]
    done = subprocess.run(report, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "summary.json").is_file()


# Start a command as a script's background job (SIGINT inherited ignored), wait until it catches SIGINT
# (SigCgt bit 2: its first handler is in), send SIGINT at once, and report the exit code.
STARTING = """
{command} >"$OUT_DIR/stdout" 2>"$OUT_DIR/stderr" &
pid=$!
for _ in $(seq 2000); do
  mask=$(awk '/^SigCgt/ {{print $2}}' /proc/$pid/status 2>/dev/null) || break
  [ -n "$mask" ] && [ $(( 0x$mask & 2 )) -ne 0 ] && break
  sleep 0.005
done
kill -INT $pid
wait $pid
echo $?
"""


def test_a_ctrl_c_while_the_cli_starts_is_not_lost(faultserver, tmp_path: Path) -> None:
    """A background job inherits SIGINT ignored, and itlaudit used to take it back only once the CLI
    had imported (~0.3 s): a Ctrl-C sent in that window was lost and the run went to its end with 0.
    The signals are now taken before the imports, so a SIGINT sent as soon as the process catches it
    ends the command: 130, one line, no traceback, no run folder half made. ~2 s."""
    url = faultserver("clean", "--step-ms", "20")
    workload = 'prompts = ["hi"]\nnum_requests = 50\nconcurrency = 1\nmax_tokens = 20\ntemperature = 0'
    scenario = write_scenario(tmp_path, url_variant("A", url), workload)
    command = shlex.join(
        [sys.executable, "-m", "itlaudit", "run", str(scenario), "--out", str(tmp_path / "run")]
    )
    done = subprocess.run(
        ["bash", "-c", STARTING.format(command=command)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OUT_DIR": str(tmp_path)},
    )
    stderr = (tmp_path / "stderr").read_text()
    assert done.stdout.split() == ["130"], (done.stdout, stderr)
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("itlaudit: interrupted by SIGINT"), stderr


SPY = """
import builtins, signal, sys
import itlaudit.cli as cli
seen = []
real = builtins.__import__
def spy(name, *args, **kwargs):
    if name == "itlaudit.cli.app" and not seen:
        seen.append(signal.getsignal(signal.SIGINT))
    return real(name, *args, **kwargs)
builtins.__import__ = spy
sys.argv = ["itlaudit", "--version"]
try:
    cli.main()
except SystemExit:
    pass
print(getattr(seen[0], "__name__", seen[0]), file=sys.stderr)
"""


def test_the_signals_are_taken_before_the_cli_is_imported() -> None:
    """What makes the test above hold whenever the signal comes: the entry point's SIGINT handler is
    in before the CLI's first import (before, a background job kept SIGINT ignored until then). ~1 s."""
    done = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().splitlines()[-1] == "_stop_while_starting", done.stderr


# A launch whose owner dies between the server's fork and its PR_SET_PDEATHSIG (a SIGKILL as a probe
# starts its server): the child's preexec is held until its parent is gone, then runs as usual.
LATE_PRCTL = """
import os, sys, threading, time
from pathlib import Path
from itlaudit.model.launch import LaunchSpec
from itlaudit.serve import launcher
real = launcher.die_with_parent
def late(*args):
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.01)
    real(*args)
launcher.die_with_parent = late
threading.Timer(1.0, lambda: os._exit(0)).start()
server = [sys.executable, "-c", "import time; time.sleep(60)"]
launcher.launch(LaunchSpec(kind="command", command=server, ready_timeout_s=30), Path({log!r}))
"""


def test_a_server_whose_owner_dies_before_its_prctl_does_not_outlive_it(tmp_path: Path) -> None:
    """The orphan tests/test_bisect_resume.py's SIGKILLed bisection left: a fake vLLM server with PPid
    1, no pid file (its owner died before writing it) and no PDEATHSIG (set after the death, so never
    sent). The server now checks its parent after the prctl and exits if it is already gone. ~2 s."""
    marker = f"ITLAUDIT_SIGNAL_TEST={uuid.uuid4()}"
    name, value = marker.split("=", 1)
    script = LATE_PRCTL.format(log=str(tmp_path / "server.log"))
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, name: value}, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 3
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal_module.SIGKILL)
    assert left == [], "the launched server outlived the itlaudit that started it"


# A set-up step (a bisect build's install, an image's pull or manifest check) signalled 0.5 s in, with
# the CLI's handlers: the step must end at once, not when its command would have.
SIGNALLED_STEP = """
import os, signal, sys, threading, time
from pathlib import Path
from itlaudit.model.stop import handle_signals
{imports}
handle_signals()
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
started = time.monotonic()
try:
    {step}
except KeyboardInterrupt:
    print(f"stopped {{time.monotonic() - started:.1f}}")
"""


def _signalled_step(imports: str, step: str) -> float:
    """Seconds from the step's start to its stop (the SIGTERM comes 0.5 s in); asserts that no process
    its command started (tagged through the environment) outlives it."""
    marker = f"ITLAUDIT_SIGNAL_TEST={uuid.uuid4()}"
    name, value = marker.split("=", 1)
    script = SIGNALLED_STEP.format(imports=imports, step=step)
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, name: value}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stopped "), done.stdout + done.stderr
    deadline = time.monotonic() + 1
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal_module.SIGKILL)
    assert left == [], "a process the step's command started outlived the stop"
    return float(done.stdout.split()[1])


# pip printing, starting a build process (a wheel's setup.py, a compiler) and waiting for it.
PIP = (
    "import subprocess, sys, time; print('installing', flush=True); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
)


@pytest.mark.fault_row("R16")
def test_a_signal_during_a_build_install_ends_it_within_the_bound(tmp_path: Path) -> None:
    """The pip, wheels and docker bisect providers built with subprocess.run, so a signal during a
    pip install waited for it to finish (minutes); run_logged now polls the stop request as the
    command provider's build does (model.stop.run_stoppable): the install is ended and the step stops
    in well under 5 s, its log kept. Stopping pip alone left the build processes it started running;
    its whole process group is ended. ~1.5 s."""
    log = tmp_path / "install.log"
    step = f"run_logged([sys.executable, '-c', {PIP!r}], Path({str(log)!r}))"
    assert _signalled_step("from itlaudit.serve.logged import run_logged", step) < 3
    assert "installing" in log.read_text()


# A docker whose registry does not answer: nothing local (`image inspect` fails), and a pull or a
# manifest check that hangs, with a child of its own.
SLOW_DOCKER = """#!/bin/sh
[ "$1" = image ] && exit 1
sleep 30
"""


@pytest.mark.fault_row("R15")
@pytest.mark.parametrize("step", ["find", "prepare"])
def test_a_signal_during_an_image_pull_or_manifest_check_ends_it_within_the_bound(
    tmp_path: Path, step: str
) -> None:
    """The docker provider's `docker manifest inspect` (find) and `docker pull` (prepare) ran under
    subprocess.run: a signal waited for the registry (a pull is minutes). They run as the pip
    provider's install does now, and end with the signal. ~1.5 s each."""
    docker = tmp_path / "docker"
    docker.write_text(SLOW_DOCKER)
    docker.chmod(0o755)
    imports = (
        "from itlaudit.bisect.build_cache import BuildCache\n"
        "from itlaudit.bisect.build_range import Build\n"
        "from itlaudit.bisect.providers.docker import DockerProvider"
    )
    cache = str(tmp_path / "cache")
    provider = f"DockerProvider(BuildCache(Path({cache!r}), 0), arch='x86_64', docker={str(docker)!r})"
    assert _signalled_step(imports, f"{provider}.{step}(Build({'e' * 40!r}, 'commit'))") < 3


# A capture worker whose forkserver dies between the fork and the worker's PR_SET_PDEATHSIG: the
# forker is this script (it imported the module, as the forkserver preloads it), the child waits for
# it to be gone, then takes its guard as worker_main does, and says if it survived it.
WORKER_LATE_PRCTL = """
import os, sys, time
from itlaudit.capture import workers
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:
        time.sleep(0.01)
    workers._die_with_parent()
    open({survived!r}, "w").close()
    os._exit(0)
os._exit(0)
"""


def test_a_worker_whose_forkserver_dies_before_its_prctl_does_not_outlive_it(tmp_path: Path) -> None:
    """The launcher's race in the capture workers: PDEATHSIG set after its parent's death is never
    sent. The worker now checks its parent right after the prctl and exits if it is already gone (the
    quiet neighbour: every capture test's workers, whose forkserver is alive, run on). ~1 s."""
    survived = tmp_path / "survived"
    script = WORKER_LATE_PRCTL.format(survived=str(survived))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    time.sleep(1.5)  # the orphan's wait for its parent's end (10 ms polls) and its guard
    assert not survived.exists(), "the worker outlived the forkserver that forked it"


UNSTARTED = """
import gc, os, signal, warnings
from itlaudit.model.stop import handle_signals
from itlaudit.workflows.signals import run_until_stopped
async def step():
    return 1
handle_signals()
os.kill(os.getpid(), signal.SIGTERM)
try:
    run_until_stopped(step())
except KeyboardInterrupt:
    print("stopped")
gc.collect()
"""


def test_a_step_a_signal_came_before_ends_unstarted_and_says_nothing_more() -> None:
    """A sweep cut between two trials ended its one line with "RuntimeWarning: coroutine ... was never
    awaited" on a loaded box: the signal landed before the next trial's step started, and the step's
    coroutine was left to the collector. It is closed now; a fresh interpreter (the handler is the
    CLI's), ~1 s."""
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", UNSTARTED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "stopped", "")
