"""`bisect --cluster ray` on a cluster of a head and two GPU worker nodes on this machine
(`ray.cluster_utils.Cluster`; the GPUs are only names, the simulator needs none), with the node running a
probe removed mid-probe: the probe runs again on the other node (or, with no rerun left, is a skip),
never good or bad from a probe that did not finish, and bisect.json names the lost node. Issue 23 item 3.

Its own module: a process joins one Ray cluster, and this one is neither test_cluster_ray's nor
test_cluster_ray_nodes' (whose nodes have no GPUs)."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simkit import itlaudit

from itlaudit.bisect import cluster as bisect_cluster

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import FAKE_VLLM, PROBE_SCENARIO

pytestmark = pytest.mark.heavy  # a Ray cluster whose nodes the tests remove

CULPRIT = 7


@pytest.fixture(scope="module")
def nodes() -> Iterator[Any]:
    """The head holds nothing (no task lands there); GPU worker nodes are added per test."""
    ray = pytest.importorskip("ray")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _two_gpu_nodes(cluster: Any) -> None:
    """Two live worker nodes of one CPU and one GPU each: a probe task takes a whole node."""
    while len(cluster.worker_nodes) < 2:
        cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()


def _args(tmp_path: Path, out: Path) -> tuple[list[str], list[str]]:
    """(shas, `itlaudit bisect` arguments): 12 commits, output capped from CULPRIT on, and a probe
    whose trial streams for about three seconds, so a node can be removed in the middle of it."""
    shas = [f"{n:02x}" * 20 for n in range(1, 13)]
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{s}\n" for s in shas))
    scenario = tmp_path / "probe.toml"
    scenario.write_text(PROBE_SCENARIO.read_text().replace("num_requests = 2", "num_requests = 20"))
    server = f"{sys.executable} {FAKE_VLLM} serve --commits {commits} --bad-from {CULPRIT} --mode cap"
    args = ["bisect", "--from", shas[0], "--to", shas[-1], "--commits-file", str(commits)]
    args += ["--provider", "command", "--server-cmd", server + " {commit} {port}", "--ready-timeout", "30"]
    args += ["--scenario", str(scenario), "--regress", "truncation", "--out", str(out)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--cluster", "ray"]
    return shas, args


def _remove_mid_probe(cluster: Any, out: Path, nth: int) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """A thread that waits for probe `nth` to stream its first trial on its node (its scratch folder is
    on this machine), then removes that node. The list gets the probe as bisect.json had it then."""
    removed: list[dict[str, Any]] = []

    def watch() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                state = json.loads((out / "bisect.json").read_text())
            except (OSError, ValueError):
                state = {}
            pending = state.get("in_progress") or []
            if len(state.get("probes", [])) == nth - 1 and pending and pending[0].get("node"):
                name = Path(pending[0]["dir"]).name
                scratch = Path(tempfile.gettempdir()).glob(f"itlaudit-probe-*/{name}/trial-1/requests.jsonl")
                if any(f.stat().st_size for f in scratch):
                    node = next(n for n in cluster.worker_nodes if n.node_id == pending[0]["node"])
                    cluster.remove_node(node, allow_graceful=False)
                    removed.append(pending[0])
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, removed


def _stop_orphans(commits: Path) -> None:
    """On one machine a removed node's probe server outlives it (it runs in its own session); on a real
    cluster it goes with the node. Stop the ones this test started."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and str(commits).encode() in argv and b"serve" in argv:
            os.kill(int(entry.name), signal.SIGKILL)


def _bisect_losing_a_node(nodes: Any, tmp_path: Path, nth: int) -> tuple[list[str], dict[str, Any], Any]:
    _two_gpu_nodes(nodes)
    out = tmp_path / "b"
    shas, args = _args(tmp_path, out)
    remover, removed = _remove_mid_probe(nodes, out, nth)
    try:
        result = itlaudit(*args)
        remover.join()
    finally:
        _stop_orphans(tmp_path / "commits.txt")
    assert removed, "the node was never removed mid-probe"
    assert result.returncode == 0, result.stderr
    return shas, json.loads((out / "bisect.json").read_text()), (removed[0], result.stderr)


def test_a_probe_whose_node_is_removed_runs_again_on_the_other_node(nodes: Any, tmp_path: Path) -> None:
    shas, state, (pending, stderr) = _bisect_losing_a_node(nodes, tmp_path, nth=3)
    assert state["first_bad"] == shas[CULPRIT] and state["last_good"] == shas[CULPRIT - 1]
    probe = state["probes"][2]
    assert probe["index"] == pending["index"] and probe["lost_nodes"] == [pending["node"]]
    assert probe["node"] != pending["node"]  # rerun on the other node, to a real verdict
    assert probe["verdict"] == ("bad" if probe["index"] >= CULPRIT else "good")
    assert (Path(probe["dir"]) / "trial-1" / "requests.jsonl").is_file()
    assert all(p["lost_nodes"] == [] for n, p in enumerate(state["probes"]) if n != 2)
    assert f"its Ray node {pending['node']} was lost; running it again on node {probe['node']}" in stderr


def test_a_probe_lost_with_no_rerun_left_is_a_skip_never_a_verdict(
    nodes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bisect_cluster, "LOST_NODE_RETRIES", 0)
    shas, state, (pending, _) = _bisect_losing_a_node(nodes, tmp_path, nth=3)
    probe = state["probes"][2]
    assert probe["index"] == pending["index"] and probe["verdict"] == "skip"
    assert probe["lost_nodes"] == [pending["node"]] and pending["node"] in probe["reason"]
    assert probe["metrics"] == {} and probe["trials"] == 0
    # The search stepped around the skipped build, on the node that was left.
    assert state["first_bad"] == shas[CULPRIT]
    assert len({p["node"] for p in state["probes"][3:]}) == 1
