"""`--cluster ray` past one node, for real: a cluster of a head and two worker nodes on this machine
(`ray.cluster_utils.Cluster`, each node its own raylet with its own CPU), the capture actors spread one
per worker node, and one worker node removed mid-run: its open requests become `worker_lost`, the run
finishes with the other node's, and meta.json names the lost node. Its own module: a process joins one
Ray cluster, and this one is not test_cluster_ray's single-node cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raykit import actors, on_second_actor

from itlaudit.cli.options import build_capture
from itlaudit.model.records import Status
from itlaudit.serve.launcher import LaunchedServer
from itlaudit.serve.truth import TruthConfig
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.workflows.selfcheck import run_itlaudit, truth_server

pytestmark = pytest.mark.heavy  # a Ray cluster of three nodes


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Head without CPUs (nothing lands there), two worker nodes of one CPU each: one actor per node."""
    ray = pytest.importorskip("ray")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    if ray.is_initialized():
        ray.shutdown()
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def truth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    with truth_server(TruthConfig(chunks_per_s=500.0), tmp_path_factory.mktemp("truth")) as server:
        yield server


def test_a_removed_node_loses_only_its_open_requests(
    cluster: Any, truth: LaunchedServer, tmp_path: Path
) -> None:
    run_dir = tmp_path / "nodes"

    def remove_node(worker: dict[str, Any]) -> str:
        """Take actor 1's node out of the cluster."""
        node = next(n for n in cluster.worker_nodes if n.node_id == worker["node"])
        cluster.remove_node(node, allow_graceful=False)
        removed_id: str = worker["node"]
        return removed_id

    # every stream open (each takes 3 s), none finished
    remover, removed = on_second_actor(run_dir, remove_node, settle_s=1.0, timeout_s=120)
    run_itlaudit(truth.url, 4, 1500, run_dir, build_capture(workers="2", cluster="ray"))
    remover.join()
    assert removed
    workers = actors(run_dir)
    assert len({w["node"] for w in workers}) == 2  # spread: one actor per worker node
    lines = list(iter_jsonl(run_dir / "requests.jsonl"))
    assert sorted(line["request_id"] for line in lines) == [f"truth-{i:05d}" for i in range(4)]
    by_worker = {w: [line for line in lines if line["worker"] == w] for w in (0, 1)}
    assert [line["status"] for line in by_worker[0]] == [Status.OK] * 2
    assert all(line["completion_tokens"] == 1500 for line in by_worker[0])
    assert [line["status"] for line in by_worker[1]] == [Status.WORKER_LOST] * 2
    assert all(removed[0] in line["error"] and line["chunk_t_ms"] == [] for line in by_worker[1])
    (lost,) = json.loads((run_dir / "meta.json").read_text())["variants"]["truth"]["lost_workers"]
    assert lost["worker"] == 1 and lost["node"] == removed[0] and lost["unfinished"] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["variants"]["truth"]["itl_ms"]["p50"] is not None  # what the other node measured
