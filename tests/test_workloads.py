"""Workloads end to end against the paced server (its own process, recording arrival times): open-loop
arrivals, warmup, datasets and auth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from test_capture import lines, paced, prompts, run  # noqa: F401  (paced is a fixture)


def test_a_40_per_s_poisson_run_arrives_at_40_per_s_with_cv_near_1_and_warmup_is_not_counted(
    tmp_path: Path, paced  # noqa: F811
) -> None:
    server = paced(interval_ms=1.0)
    workload = (
        f"{prompts(4)}\nnum_requests = 120\nmax_tokens = 4\nrequest_rate = 40\nwarmup_requests = 5\nseed = 3"
    )
    result = run(tmp_path, server.url, workload, "--workers", "2")
    assert result.returncode == 0, result.stderr
    arrivals = np.array(sorted(server.stop()["arrivals"]))
    assert len(arrivals) == 125
    measured = np.diff(arrivals[5:])
    rate = len(measured) / (arrivals[-1] - arrivals[5])
    assert 32 < rate < 50, rate
    cv = measured.std() / measured.mean()
    assert 0.7 < cv < 1.35, cv
    raw = lines(tmp_path)
    assert sum(r["warmup"] for r in raw) == 5 and len(raw) == 125
    assert all(r["scheduled_ms"] is not None and r["sent_offset_ms"] is not None for r in raw)
    assert len(lines(tmp_path, "derived.jsonl")) == 120
    block = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]
    assert block["requests"] == 120
    assert block["schedule_lag_ms"]["count"] == 120
    assert 0 <= block["schedule_lag_ms"]["p99"] < 100  # a client that keeps up at 40/s on loopback
    assert "schedule lag (ms)" in (tmp_path / "run" / "report.md").read_text()
