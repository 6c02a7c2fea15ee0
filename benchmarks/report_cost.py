"""What a run spends after its last stream closed (issue 38 items 4 and 6): deriving the folder's files
and writing its report, as `RunFolder.finish` does (meta.json `finish_s`), on run folders of a known size.

The folders are built from a real run: `itlaudit sim` (1 ms a step) and `itlaudit run` of a few streams
give a template folder (meta.json, the /metrics sampler's server_metrics.jsonl, requests.jsonl as the
capture writes it); its records are then cloned to N requests (new ids, each stream's times stretched
by a factor of 0.9-1.1) and written back as JSON lines, so every case has the capture's own record
format and a server timeline. Cases are NxT (N requests of T tokens) and `reply50MB` (one request
whose answer is 50 MB of prose, benchmarks/derive_long_output.py's).

Each case is timed in a fresh interpreter per tree and round (the imports a run's finish pays are in
the figure, as they are in `finish_s`), the trees interleaved round by round: with `--base DIR` (a
`git worktree` of the commit before) every figure has the base's beside it and the ratio new/base. The
reference every row also carries is the floor: the seconds to read requests.jsonl's bytes and decode
its lines with msgspec in the same child, which no derivation can go under. Peak RSS is the child's
high-water mark (ru_maxrss) after the work; CPU the child's and its drawing processes' user + system
seconds over the finish, steadier than the wall time on a loaded machine.

    .venv/bin/python benchmarks/report_cost.py --cases 64x500,1024x500 --base /tmp/base --rounds 3
    .venv/bin/python benchmarks/report_cost.py --cases 10000x100,5000x100,reply50MB --rounds 1
    .venv/bin/python benchmarks/report_cost.py --cases 1024x500 --stages     # where the seconds go
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVED = "report-cost-sim"
TEMPLATE_STREAMS = 8
INPUTS = ("requests.jsonl", "meta.json", "server_metrics.jsonl")  # what a finish reads; the rest it writes
REPLY_MB = 50


def _itlaudit() -> list[str]:
    """This checkout's itlaudit (main() puts it first on PYTHONPATH), whatever the venv installed."""
    return [sys.executable, "-m", "itlaudit"]


def template(root: Path, tokens: int) -> Path:
    """A real run folder of TEMPLATE_STREAMS streams of `tokens` tokens against the simulator."""
    from itlaudit.serve.launcher import LaunchSpec, launch

    folder = root / f"template{tokens}"
    spec = LaunchSpec(
        kind="command",
        command=[*_itlaudit(), "sim", "--port", "{port}", "--step-ms", "1", "--model", SERVED],
        ready_timeout_s=60,
    )
    server = launch(spec, root / f"sim{tokens}.log")
    try:
        scenario = root / f"template{tokens}.toml"
        scenario.write_text(
            f'name = "report-cost"\nendpoint = "completions"\n\n[workload]\nprompts = ["Tell me a story."]\n'
            f"num_requests = {TEMPLATE_STREAMS}\nconcurrency = {TEMPLATE_STREAMS}\nmax_tokens = {tokens}\n"
            f'temperature = 0\n\n[[variants]]\nname = "A"\nurl = "{server.url}"\n',
            encoding="utf-8",
        )
        argv = [
            *_itlaudit(),
            "run",
            str(scenario),
            "--out",
            str(folder),
            "--ledger",
            str(root / "ledger.jsonl"),
        ]
        subprocess.run([*argv, "--no-plots"], cwd=root, capture_output=True, check=True, timeout=600)
    finally:
        server.stop()
    return folder


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    from itlaudit.store.rundir import write_jsonl

    write_jsonl(path, lines)


def build_case(root: Path, case: str, templates: dict[int, Path]) -> Path:
    """The case's folder: the template's meta.json and telemetry, its records cloned to the case's size."""
    if case == "reply50MB":
        requests, tokens = 1, 500
    else:
        requests, tokens = (int(x) for x in case.split("x"))
    if tokens not in templates:
        templates[tokens] = template(root, tokens)
    source = templates[tokens]
    folder = root / case
    folder.mkdir()
    for name in INPUTS[1:]:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    lines = (source / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    header = [json.loads(x) for x in lines if '"request_id"' not in x]
    records = [json.loads(x) for x in lines if '"request_id"' in x]
    rng = random.Random(38)
    out = []
    for i in range(requests):
        record = dict(records[i % len(records)])
        stretch = rng.uniform(0.9, 1.1)
        record["request_id"] = f"A-{i:05d}"
        record["chunk_t_ms"] = [t * stretch for t in record["chunk_t_ms"]]
        record["e2e_ms"] = record["e2e_ms"] * stretch
        out.append(record)
    if case == "reply50MB":
        spec = importlib.util.spec_from_file_location(
            "derive_long_output", ROOT / "benchmarks/derive_long_output.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[0]["text"] = module.prose(REPLY_MB * 10**6)
    _write_lines(folder / "requests.jsonl", header + out)
    return folder


def _floor(folder: Path) -> float:
    """Reading requests.jsonl and decoding each line: what no derivation of it goes under."""
    import msgspec

    started = time.perf_counter()
    decode = msgspec.json.Decoder().decode
    for line in (folder / "requests.jsonl").read_bytes().splitlines():
        decode(line)
    return time.perf_counter() - started


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the forked drawing processes): on a
    loaded machine a steadier figure than the wall time."""
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(folder: Path, stages: bool) -> dict[str, Any]:
    """In a fresh interpreter on one tree: the finish of a copy of `folder`, timed as RunFolder.finish
    times it (the derivation module imported first, pandas and matplotlib inside the figure)."""
    import resource

    from itlaudit.workflows.derive import derive_figures, write_report

    scratch = Path(tempfile.mkdtemp(prefix="report-cost-"))
    try:
        for name in INPUTS:
            if (folder / name).exists():
                shutil.copy(folder / name, scratch / name)
        floor = _floor(scratch)
        spent: dict[str, float] = {}
        if stages:
            _wrap_stages(spent)
        cpu = _cpu_s()
        started = time.perf_counter()
        derivation = derive_figures(scratch, "report cost", ["A"])
        derived = time.perf_counter()
        write_report(derivation)
        done = time.perf_counter()
        cpu = _cpu_s() - cpu
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {
            "derive": derived - started,
            "report": done - derived,
            "finish": done - started,
            "cpu": cpu,
            "floor": floor,
            "rss_mb": rss_mb,
            "stages": spent,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _wrap_stages(spent: dict[str, float]) -> None:
    """Time the finish's steps by the names both trees have (first call's imports included)."""
    import itlaudit.report.writer as writer
    import itlaudit.workflows.derive as wf

    def timed(module: Any, name: str, label: str) -> None:
        inner = getattr(module, name, None)
        if inner is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        setattr(module, name, wrapper)

    timed(wf, "read_records", "read requests.jsonl")
    timed(wf, "derive_requests", "per-request metrics and findings")
    timed(wf, "summarize_run", "summary (variant blocks)")
    timed(wf, "request_line", "derived.jsonl lines (text quality)")
    timed(wf, "_csv_frame", "requests.csv frame (pandas import)")
    timed(wf, "write_chunks", "chunks.csv")
    timed(writer, "write_plots", "plots (matplotlib import)")
    timed(writer, "render_report", "report.md")
    timed(writer, "render_html", "report.html")
    try:
        import itlaudit.report.plots as plots
    except ImportError:
        return
    named = []
    for entry in plots.PLOTS:
        name, caption, function = entry[:3]

        def drawn(variants: Any, path: Path, function: Any = function, name: str = name) -> Any:
            started = time.perf_counter()
            try:
                return function(variants, path)
            finally:
                spent[f"  {name}"] = spent.get(f"  {name}", 0.0) + time.perf_counter() - started

        named.append((name, caption, drawn, *entry[3:]))
    plots.PLOTS = tuple(named)


def run_child(tree: Path, folder: Path, stages: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, __file__, "--child", str(folder)] + (["--stages"] if stages else [])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {folder.name} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default="64x500,1024x500", help="NxT (requests x tokens) or reply50MB, by commas"
    )
    parser.add_argument(
        "--base", type=Path, help="A checkout of the commit before (git worktree), timed alongside."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Rounds, trees interleaved (default 3).")
    parser.add_argument(
        "--stages", action="store_true", help="Also time the finish's steps (one more round)."
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.stages)))
        return

    os.environ["PYTHONPATH"] = str(ROOT)  # the template run's itlaudit is this checkout's
    trees = {"new": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="itlaudit-report-cost-") as scratch:
        root = Path(scratch)
        templates: dict[int, Path] = {}
        for case in args.cases.split(","):
            folder = build_case(root, case, templates)
            rows: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    rows[name].append(run_child(tree, folder, stages=False))
            size = (folder / "requests.jsonl").stat().st_size / 1e6
            print(f"\n{case} (requests.jsonl {size:.1f} MB), median of {args.rounds}:")
            for name, got in rows.items():
                finish, floor = _median(got, "finish"), _median(got, "floor")
                line = (
                    f"  {name:<5} finish {finish:6.2f} s (derive {_median(got, 'derive'):5.2f} + report "
                    f"{_median(got, 'report'):5.2f}; min {min(r['finish'] for r in got):5.2f})  "
                    f"{finish / floor:5.1f}x the read floor {floor:.2f} s  "
                    f"peak RSS {_median(got, 'rss_mb'):6.0f} MB  CPU {_median(got, 'cpu'):5.2f} s"
                )
                if name == "new" and "base" in rows:
                    line += f"  new/base {finish / _median(rows['base'], 'finish'):.2f}"
                    line += f" (CPU {_median(got, 'cpu') / _median(rows['base'], 'cpu'):.2f})"
                print(line)
            if args.stages:
                for name, tree in trees.items():
                    spent = run_child(tree, folder, stages=True)["stages"]
                    print(
                        f"  stages ({name}): " + "; ".join(f"{k.strip()} {v:.2f}" for k, v in spent.items())
                    )
            print(
                json.dumps(
                    {"case": case, **{n: [round(r["finish"], 3) for r in got] for n, got in rows.items()}}
                )
            )


if __name__ == "__main__":
    main()
