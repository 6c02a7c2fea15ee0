"""`--cluster ray`: the capture workers as Ray actors on a local cluster (one per module: Ray takes
seconds to start), graded against the ground-truth server; a killed actor's requests become
`worker_lost` and the run still finishes; without Ray the flag says how to install it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raykit import actors, on_second_actor

from itlaudit import cli
from itlaudit.capture.cluster import INSTALL_HINT
from itlaudit.cli.options import build_capture, parse_cluster
from itlaudit.errors import ClusterError
from itlaudit.model.records import Status
from itlaudit.serve.launcher import LaunchedServer
from itlaudit.serve.truth import TruthConfig
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.workflows.selfcheck import fetch_send_log, grade_run, reset_send_log, run_itlaudit, truth_server


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    # Three CPUs on a 2-core machine: two capture actors and room for Ray's own bookkeeping tasks; three
    # GPUs that are only names, so bisect probes can hold one each (the simulator needs none).
    # address="local": a cluster of its own, even where `ray start` left one (or its address file).
    ray.init(
        address="local",
        num_cpus=3,
        num_gpus=3,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    with truth_server(TruthConfig(chunks_per_s=500.0), tmp_path_factory.mktemp("truth")) as server:
        yield server


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(run_dir / "requests.jsonl"))


@pytest.mark.heavy  # the module's Ray cluster
def test_two_actors_measure_as_the_truth_says(
    ray_cluster: Any, truth: LaunchedServer, tmp_path: Path
) -> None:
    reset_send_log(truth.url)
    run_dir = run_itlaudit(truth.url, 8, 500, tmp_path / "ray", build_capture(workers="2", cluster="ray"))
    lines = _lines(run_dir)
    ids = [line["request_id"] for line in lines]
    assert len(ids) == 8 and len(set(ids)) == 8
    assert {line["status"] for line in lines} == {Status.OK}
    assert sorted({line["worker"] for line in lines}) == [0, 1]
    result = grade_run(run_dir, fetch_send_log(truth.url))
    assert result.responses == 8 and result.every_chunk_stamped, result
    assert result.worst_itl_error is not None and result.worst_itl_error <= 0.03, result
    workers = actors(run_dir)
    assert [w["worker"] for w in workers] == [0, 1]
    for worker in workers:
        assert worker["node"] and worker["hostname"] and worker["pid"] != os.getpid()
        assert worker["clock_rtt_ns"] > 0 and abs(worker["clock_offset_ns"]) <= worker["clock_rtt_ns"]
        assert worker["loop_lag_ticks"] > 0 and worker["loop_lag_max_ms"] >= worker["loop_lag_p99_ms"] >= 0
    # Records identical in form to a local run's: the same fields, every one of them.
    local_dir = run_itlaudit(truth.url, 2, 20, tmp_path / "local", build_capture(workers="2"))
    assert [sorted(line) for line in _lines(local_dir)] == [sorted(lines[0])] * 2
    assert "node" not in actors(local_dir)[0]


@pytest.mark.heavy  # the module's Ray cluster
def test_a_killed_actor_leaves_worker_lost_records_and_the_run_finishes(
    ray_cluster: Any, truth: LaunchedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "killed"

    def kill(worker: dict[str, Any]) -> int:
        """SIGKILL actor 1 as a dying node would take it."""
        os.kill(worker["pid"], signal.SIGKILL)
        pid: int = worker["pid"]
        return pid

    # mid-run: every stream open, none finished (each takes 3 s)
    killer, killed = on_second_actor(run_dir, kill, settle_s=0.5, timeout_s=60)
    run_itlaudit(truth.url, 4, 1500, run_dir, build_capture(workers="2", cluster="ray"))
    killer.join()
    assert killed
    lines = _lines(run_dir)
    assert sorted(line["request_id"] for line in lines) == [f"truth-{i:05d}" for i in range(4)]
    by_worker = {w: [line for line in lines if line["worker"] == w] for w in (0, 1)}
    assert [line["status"] for line in by_worker[0]] == [Status.OK] * 2
    assert all(line["completion_tokens"] == 1500 for line in by_worker[0])
    assert [line["status"] for line in by_worker[1]] == [Status.WORKER_LOST] * 2
    assert all("lost" in line["error"] and line["chunk_t_ms"] == [] for line in by_worker[1])
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["variants"]["truth"]["lost_workers"] == [
        {
            "worker": 1,
            "node": actors(run_dir)[1]["node"],
            "reason": by_worker[1][0]["error"],
            "unfinished": 2,
        }
    ]
    assert "capture worker 1 was lost" in capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["variants"]["truth"]["itl_ms"]["p50"] is not None  # what the other actor measured


@pytest.mark.heavy  # the module's Ray cluster
def test_bisect_probes_run_as_ray_tasks_of_one_gpu_each(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
    from helpers import FAKE_VLLM, PROBE_SCENARIO

    shas = [f"{n:040x}" for n in range(1, 13)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{s}\n" for s in shas))
    server = (
        f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from 7 --mode cap {{commit}} {{port}}"
    )
    out = tmp_path / "bisect"
    monkeypatch.setattr(sys, "argv", [
        "itlaudit", "bisect", "--from", shas[0], "--to", shas[-1], "--commits-file", str(commits),
        "--provider", "command", "--server-cmd", server, "--ready-timeout", "30",
        "--scenario", str(PROBE_SCENARIO), "--regress", "truncation", "--out", str(out),
        "--cache-dir", str(tmp_path / "cache"), "--parallel", "3", "--cluster", "ray",
    ])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 0
    state = json.loads((out / "bisect.json").read_text())
    assert state["first_bad"] == shas[7] and state["last_good"] == shas[6]
    rounds: dict[int, list[str]] = {}
    for probe in state["probes"]:
        rounds.setdefault(probe["round"], []).append(probe["gpu"])
        # The task's folder came back to the caller's disk.
        assert (Path(probe["dir"]) / "trial-1" / "requests.jsonl").is_file()
    assert state["rounds_used"] <= math.ceil(math.log(len(shas), 4)) + 2
    for gpus in rounds.values():
        assert len(set(gpus)) == len(gpus) and all(g in ("0", "1", "2") for g in gpus), rounds


def test_cluster_values_and_the_install_hint(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    assert parse_cluster("none") is None
    assert parse_cluster("ray") == parse_cluster("auto") == "auto"
    assert parse_cluster("ray://head:10001") == "ray://head:10001"
    for bad in ("ray://", "k8s", "ray:auto"):
        with pytest.raises(ClusterError, match="use none, ray"):
            parse_cluster(bad)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.setattr(sys, "argv", ["itlaudit", "run", "x.toml", "--cluster", "ray", "--url", "http://h:1"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == f"itlaudit: error: {INSTALL_HINT}"


def test_ray_is_imported_only_when_asked() -> None:
    code = (
        "import sys, itlaudit.cli.app, itlaudit.capture.runner, itlaudit.bisect.bisector; "
        "print('ray' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
