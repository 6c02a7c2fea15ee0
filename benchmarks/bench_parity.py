"""vllm bench serve and itlaudit on the same random workload: do they report the same mean TPOT and TTFT?
(issue 14's "done when").

Per round, both clients run the same workload (`vllm bench serve --dataset-name random` and the scenario
it translates to, docs/scenarios.md "From a vllm bench serve command") at the same moment against one
server: vllm bench is held after its imports and dataset (`vllm_bench_client.py --start-when`) until
itlaudit's capture workers are about to send, so the two see the same server state rather than two
moments of a server whose speed drifts between runs. Rounds repeat that, and the table shows each
round's ratio, vllm bench over itlaudit, and how many rounds fall within 5 %.

    .venv/bin/python benchmarks/bench_parity.py --url http://127.0.0.1:8000 --tokenizer MODEL_DIR \\
        --served-model-name tiny --vllm-python ~/.cache/itlaudit/testbed/.../bin/python --rounds 5

Prints a Markdown table; `--json FILE` keeps the rounds. The tests (`tests/test_workloads_vllm.py`) run
one round through `run_round`.

`run_pasted` runs one pasted vllm bench serve line twice, one after the other, as vllm bench and as
`itlaudit run` with the same arguments, each in its own folder (tests/test_bench_lines_vllm.py, issue 36).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from itlaudit.analysis.importers import parse_import

HERE = Path(__file__).resolve().parent
TARGET = 0.05  # the agreement on mean TPOT
_READY_TIMEOUT_S = 180.0
_RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    """One `vllm bench serve --dataset-name random` workload, in its own flags' terms."""

    input_len: int = 64
    output_len: int = 32
    rate: float = 4.0
    burstiness: float = 1.0
    requests: int = 40

    def bench_args(self) -> list[str]:
        return [
            "--backend", "openai", "--endpoint", "/v1/completions", "--dataset-name", "random",
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--request-rate", str(self.rate), "--burstiness", str(self.burstiness),
            "--num-prompts", str(self.requests),
        ]  # fmt: skip

    def scenario_toml(self) -> str:
        """The same workload as an itlaudit scenario (variant "A")."""
        return (
            'name = "bench-parity"\nendpoint = "completions"\n[workload]\n'
            f"num_requests = {self.requests}\nrequest_rate = {self.rate}\nburstiness = {self.burstiness}\n"
            f'[workload.dataset]\nkind = "random"\ninput_len = {self.input_len}\n'
            f'output_len = {self.output_len}\n[[variants]]\nname = "A"\n'
        )


@dataclass(frozen=True)
class Round:
    """One round's means (ms): vllm bench's from its --save-result JSON, itlaudit's from summary.json."""

    bench_ttft_ms: float
    bench_tpot_ms: float
    itlaudit_ttft_ms: float
    itlaudit_tpot_ms: float
    requests: int

    @property
    def tpot_ratio(self) -> float:
        return self.bench_tpot_ms / self.itlaudit_tpot_ms

    @property
    def ttft_ratio(self) -> float:
        return self.bench_ttft_ms / self.itlaudit_ttft_ms


def _tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""


def _wait_for(ready: Callable[[], bool], process: subprocess.Popen[str], what: str, log: Path) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before it was ready: {_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready in {_READY_TIMEOUT_S:g} s: {_tail(log)}")
        time.sleep(0.005)


def _capturing(run_dir: Path) -> bool:
    """meta.json names the capture workers just before they start sending."""
    meta = run_dir / "meta.json"
    return meta.exists() and '"workers"' in meta.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class _Client:
    """One client process: its command, working folder, environment, and the file its output goes to
    (stdout and stderr together: a file, not a pipe, so a full pipe never stalls a client mid-run)."""

    command: list[str]
    cwd: Path
    env: Mapping[str, str] | None
    log: Path


@contextlib.contextmanager
def _started(client: _Client) -> Iterator[subprocess.Popen[str]]:
    """The client's process, its output to its log; killed on the way out if it is still running (the
    other client failed, or this was interrupted), so none waits on a gate forever."""
    with (
        client.log.open("w", encoding="utf-8") as log,
        subprocess.Popen(
            client.command, cwd=client.cwd, env=dict(client.env or os.environ), stdout=log,
            stderr=subprocess.STDOUT, text=True,
        ) as process,
    ):  # fmt: skip
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()


def _run_at_once(bench: _Client, ours: _Client, gate: Path, run_dir: Path) -> None:
    """vllm bench (started by vllm_bench_client.py --start-when `gate`) and itlaudit (writing `run_dir`)
    sending at the same moment: vllm bench is held after its imports and dataset until itlaudit's capture
    workers are about to send. Raises with the tail of a client's output when it fails."""
    with _started(bench) as bench_process:
        _wait_for(gate.with_name(gate.name + ".ready").exists, bench_process, "vllm bench serve", bench.log)
        with _started(ours) as ours_process:
            _wait_for(lambda: _capturing(run_dir), ours_process, "itlaudit run", ours.log)
            gate.touch()
            ours_process.wait(timeout=_RUN_TIMEOUT_S)
        bench_process.wait(timeout=_RUN_TIMEOUT_S)
    if ours_process.returncode != 0:
        raise RuntimeError(f"itlaudit run exited with {ours_process.returncode}: {_tail(ours.log)}")
    if bench_process.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited with {bench_process.returncode}: {_tail(bench.log)}")


def _run_alone(client: _Client, what: str) -> None:
    """One client to its end, the server to itself; raises with the tail of its output when it fails."""
    with _started(client) as process:
        process.wait(timeout=_RUN_TIMEOUT_S)
    if process.returncode != 0:
        raise RuntimeError(f"{what} exited with {process.returncode}: {_tail(client.log)}")


def _bench_command(vllm_python: Path, gate: Path | None, bench_args: Sequence[str]) -> list[str]:
    held = ["--start-when", str(gate)] if gate is not None else []
    return [str(vllm_python), str(HERE / "vllm_bench_client.py"), *held, *bench_args]


def run_round(
    url: str,
    workload: Workload,
    workdir: Path,
    *,
    tokenizer: Path,
    served_model_name: str,
    vllm_python: Path,
    bench_env: Mapping[str, str] | None = None,
    itlaudit_env: Mapping[str, str] | None = None,
) -> Round:
    """Both clients at once against `url`; their output stays in `workdir` (vllm.json, run/, and what
    each printed: vllm-bench.log, itlaudit.log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "s.toml").write_text(workload.scenario_toml(), encoding="utf-8")
    gate = workdir / "go"
    bench_args = [
        "--base-url", url, "--model", str(tokenizer), "--served-model-name", served_model_name,
        *workload.bench_args(), "--save-result", "--save-detailed", "--result-dir", str(workdir),
        "--result-filename", "vllm.json", "--disable-tqdm",
    ]  # fmt: skip
    ours_command = [
        sys.executable,
        "-m",
        "itlaudit",
        "run",
        "s.toml",
        "--url",
        url,
        "--out",
        str(workdir / "run"),
    ]
    _run_at_once(
        _Client(
            _bench_command(vllm_python, gate, bench_args), workdir, bench_env, workdir / "vllm-bench.log"
        ),
        _Client(ours_command, workdir, itlaudit_env, workdir / "itlaudit.log"),
        gate,
        workdir / "run",
    )
    theirs = parse_import(json.loads((workdir / "vllm.json").read_text(encoding="utf-8")), "vllm.json")
    summary = json.loads((workdir / "run" / "summary.json").read_text(encoding="utf-8"))["variants"]["A"]
    if theirs.requests != workload.requests or summary["requests"] != workload.requests:
        raise RuntimeError(
            f"completed requests: vllm bench {theirs.requests}, itlaudit {summary['requests']}, "
            f"of {workload.requests}"
        )
    return Round(
        bench_ttft_ms=theirs.figures["ttft_ms"]["mean"],
        bench_tpot_ms=theirs.figures["tpot_ms"]["mean"],
        itlaudit_ttft_ms=summary["ttft_ms"]["mean"],
        itlaudit_tpot_ms=summary["tpot_ms"]["mean"],
        requests=workload.requests,
    )


@dataclass(frozen=True)
class Pasted:
    """One pasted line run by both clients: each one's working folder, where a relative --result-dir
    of the line lands, and what each printed."""

    vllm_dir: Path
    itlaudit_dir: Path
    run_dir: Path  # itlaudit's run folder
    vllm_output: str
    itlaudit_output: str


def run_pasted(
    bench_args: Sequence[str],
    workdir: Path,
    *,
    vllm_python: Path,
    itlaudit_args: Sequence[str] = (),
    bench_env: Mapping[str, str] | None = None,
    itlaudit_env: Mapping[str, str] | None = None,
) -> Pasted:
    """`vllm bench serve BENCH_ARGS`, then `itlaudit run BENCH_ARGS`, one after the other, each with
    the server to itself: sent at once (as run_round does, for one workload's means), a burst line's
    requests queue behind the other client's, so one side's TTFT is the other's run (seen: vllm
    bench's median TTFT 1220 ms against itlaudit's 45 ms for --request-rate inf, concurrency 12 each).
    Each client writes in its own folder under `workdir` (vllm/, itlaudit/) so that the line's own
    --result-dir and --result-filename serve both without a clash. itlaudit gets the line unchanged,
    then `--out` (its run folder, workdir/run) and `itlaudit_args`: its own options, none of vllm
    bench's."""
    vllm_dir, itlaudit_dir, run_dir = workdir / "vllm", workdir / "itlaudit", workdir / "run"
    for folder in (vllm_dir, itlaudit_dir):
        folder.mkdir(parents=True, exist_ok=True)
    ours_command = [
        sys.executable, "-m", "itlaudit", "run", *bench_args, "--out", str(run_dir), *itlaudit_args,
    ]  # fmt: skip
    # vllm bench's ready check (the first prompt at its full output length, before its run) is a
    # request itlaudit does not send: skipped (its own option, the last given wins), as the server
    # is known to be up.
    quick_args = [*bench_args, "--ready-check-timeout-sec", "0"]
    bench = _Client(
        _bench_command(vllm_python, None, quick_args), vllm_dir, bench_env, workdir / "vllm-bench.log"
    )
    ours = _Client(ours_command, itlaudit_dir, itlaudit_env, workdir / "itlaudit.log")
    _run_alone(bench, "vllm bench serve")
    _run_alone(ours, "itlaudit run")
    return Pasted(
        vllm_dir=vllm_dir,
        itlaudit_dir=itlaudit_dir,
        run_dir=run_dir,
        vllm_output=bench.log.read_text(encoding="utf-8", errors="replace"),
        itlaudit_output=ours.log.read_text(encoding="utf-8", errors="replace"),
    )


def table(rounds: list[Round]) -> str:
    lines = [
        "| round | vllm bench TTFT ms | itlaudit TTFT ms (vllm vs it) "
        "| vllm bench TPOT ms | itlaudit TPOT ms (vllm vs it) |",
        "|---|---:|---:|---:|---:|",
    ]
    for index, r in enumerate(rounds, 1):
        lines.append(
            f"| {index} | {r.bench_ttft_ms:.2f} | {r.itlaudit_ttft_ms:.2f} ({r.ttft_ratio - 1:+.1%}) | "
            f"{r.bench_tpot_ms:.3f} | {r.itlaudit_tpot_ms:.3f} ({r.tpot_ratio - 1:+.1%}) |"
        )
    within = sum(abs(r.tpot_ratio - 1) <= TARGET for r in rounds)
    spread = [r.tpot_ratio - 1 for r in rounds]
    lines.append(
        f"\nmean TPOT, vllm bench over itlaudit: within {TARGET:.0%} in {within} of {len(rounds)} rounds "
        f"(median {statistics.median(spread):+.2%}, range {min(spread):+.2%} .. {max(spread):+.2%}); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tokenizer", type=Path, required=True, help="the served model's directory")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--vllm-python", type=Path, required=True, help="an interpreter that imports vllm")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--input-len", type=int, default=Workload.input_len)
    parser.add_argument("--output-len", type=int, default=Workload.output_len)
    parser.add_argument("--rate", type=float, default=Workload.rate)
    parser.add_argument("--burstiness", type=float, default=Workload.burstiness)
    parser.add_argument("--requests", type=int, default=Workload.requests)
    parser.add_argument("--workdir", type=Path, help="keep each round's outputs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the rounds here")
    args = parser.parse_args(argv)
    workload = Workload(args.input_len, args.output_len, args.rate, args.burstiness, args.requests)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-parity-"))
    rounds = []
    for index in range(args.rounds):
        done = run_round(
            args.url,
            workload,
            workdir / f"round-{index + 1}",
            tokenizer=args.tokenizer,
            served_model_name=args.served_model_name,
            vllm_python=args.vllm_python,
        )
        print(
            f"round {index + 1}: mean TPOT vllm bench {done.bench_tpot_ms:.3f} / itlaudit "
            f"{done.itlaudit_tpot_ms:.3f} ms ({done.tpot_ratio - 1:+.2%}), "
            f"mean TTFT {done.bench_ttft_ms:.2f} / {done.itlaudit_ttft_ms:.2f} ms",
            flush=True,
        )
        rounds.append(done)
    print(f"\n{asdict(workload)}\n")
    print(table(rounds))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"workload": asdict(workload), "rounds": [asdict(r) for r in rounds]}, indent=1),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
