"""Workloads end to end against the paced server (its own process, recording arrival times): open-loop
arrivals, warmup, datasets and auth."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from pacedkit import itlaudit, lines, prompts, run, scenario

from itlaudit.model.records import RequestRecord
from itlaudit.model.scenario import load_scenario
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.workflows.run import run_scenario
from itlaudit.workflows.run_folder import RunFolder
from itlaudit.workflows.variant_pass import WindowHook


def test_a_40_per_s_poisson_run_arrives_at_40_per_s_with_cv_near_1_and_warmup_is_not_counted(
    tmp_path: Path,
    paced,
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
    print(
        f"server-side rate {rate:.1f}/s, CV {cv:.2f}, "
        f"schedule lag p99 {block['schedule_lag_ms']['p99']:.2f} ms"
    )
    assert "schedule lag (ms)" in (tmp_path / "run" / "report.md").read_text()


KEY = "sk-planted-0123456789abcdef"
TEAM_TOKEN = "team-token-planted-42424242"


def files_holding(root: Path, *needles: str) -> list[str]:
    """Every file under root (a run folder, the ledger, reports) that holds one of the needles."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.name.startswith("paced-"):  # the test server's own log
            data = path.read_bytes()
            hits += [f"{path}: {needle}" for needle in needles if needle.encode() in data]
    return hits


def test_the_api_key_is_sent_on_every_request_and_reaches_no_file(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0, extra=("--api-key", KEY))
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\n[workload]\n{prompts(2)}\nnum_requests = 4\nconcurrency = 2\nmax_tokens = 3\n'
        '[[variants]]\nname = "A"\nheaders = { "X-Tenant" = "tenant-a" }\n',
        encoding="utf-8",
    )
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    env.pop("VLLM_API_KEY", None)
    result = itlaudit(
        "run", str(path), "--url", server.url, "--out", str(tmp_path / "run"),
        "--header", f"X-Team-Token: {TEAM_TOKEN}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = server.stop()["seen"]
    assert {(s["method"], s["path"]) for s in seen} >= {("GET", "/v1/models"), ("POST", "/v1/completions")}
    assert all(s["key_ok"] for s in seen), seen  # models, identity ping, version and every stream
    streams = [s for s in seen if s["path"] == "/v1/completions"]
    assert all({"x-team-token", "x-tenant", "authorization"} <= set(s["headers"]) for s in streams)
    assert len(lines(tmp_path)) == 4
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["variants"]["A"]["headers"] == ["Authorization", "X-Team-Token", "X-Tenant"]  # names only
    assert files_holding(tmp_path, KEY, TEAM_TOKEN) == []


def test_a_wrong_key_is_one_line_and_the_server_echo_of_it_is_masked(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0, extra=("--api-key", KEY))
    wrong = "sk-wrong-planted-987654321"
    result = run(tmp_path, server.url, f"{prompts(2)}\nmax_tokens = 3", "--api-key", wrong)
    assert result.returncode == 2
    assert "401" in result.stderr and wrong not in result.stderr
    assert files_holding(tmp_path, wrong) == []


def cache_reset_run(tmp_path: Path, url: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\n[workload]\n{prompts(2)}\nmax_tokens = 3\n'
        '[[variants]]\nname = "A"\nreset_prefix_cache = true\n[[variants]]\nname = "B"\n',
        encoding="utf-8",
    )
    result = itlaudit("run", str(path), "--url", url, "--out", str(tmp_path / "run"), cwd=tmp_path)
    return result, json.loads((tmp_path / "run" / "meta.json").read_text())["variants"]


def test_reset_prefix_cache_is_posted_before_its_variant_only_and_recorded(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    result, variants = cache_reset_run(tmp_path, server.url)
    assert result.returncode == 0, result.stderr
    seen = server.stop()["seen"]
    resets = [i for i, s in enumerate(seen) if s["path"] == "/reset_prefix_cache"]
    first_stream = next(i for i, s in enumerate(seen) if s["stream"])
    assert len(resets) == 1 and resets[0] < first_stream
    assert variants["A"]["reset_prefix_cache"] == {"done": True}
    assert "reset_prefix_cache" not in variants["B"]


def test_reset_prefix_cache_without_dev_mode_says_so_in_one_line_and_goes_on(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0, fault="no_dev_mode")
    result, variants = cache_reset_run(tmp_path, server.url)
    assert result.returncode == 0, result.stderr
    assert "needs VLLM_SERVER_DEV_MODE=1" in result.stderr
    assert variants["A"]["reset_prefix_cache"]["done"] is False
    assert len(lines(tmp_path)) == 4  # both variants measured


def test_jsonl_max_tokens_reach_the_server_and_the_report_breaks_down_by_category(
    tmp_path: Path,
    paced,
) -> None:
    server = paced(interval_ms=1.0)
    rows = [
        {"prompt": "code-1", "max_tokens": 3, "category": "coding"},
        {"prompt": "math-1", "max_tokens": 7, "category": "math"},
        {"prompt": "math-2", "max_tokens": 5, "category": "math"},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    workload = 'num_requests = 6\nconcurrency = 2\nmax_tokens = 50\n[workload.dataset]\nkind = "jsonl"\n'
    workload += 'path = "d.jsonl"'
    path = tmp_path / "s.toml"
    path.write_text(f'name = "t"\n[workload]\n{workload}\n[[variants]]\nname = "A"\n', encoding="utf-8")
    result = itlaudit("run", str(path), "--url", server.url, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    asked = sorted((row["prompt"], row["max_tokens"]) for row in server.stop()["finished"])
    assert asked == sorted([("code-1", 3), ("math-1", 7), ("math-2", 5)] * 2)
    raw = lines(tmp_path)
    assert sorted(r["category"] for r in raw) == ["coding"] * 2 + ["math"] * 4
    assert all(r["completion_tokens"] == r["params"]["max_tokens"] for r in raw)
    categories = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]["categories"]
    assert {name: row["requests"] for name, row in categories.items()} == {"coding": 2, "math": 4}
    assert categories["math"]["itl_ms"]["p50"] is not None
    assert "| math | 4 |" in (tmp_path / "run" / "report.md").read_text()
    assert "<td>math</td><td>4</td>" in (tmp_path / "run" / "report.html").read_text()


def test_tls_settings_build_one_context_and_bad_tls_or_header_options_are_one_line(tmp_path: Path) -> None:
    import ssl

    from itlaudit.model.access import Access

    assert Access().ssl_context() is None  # the transport's default: verified against the system CAs
    insecure = Access(insecure=True).ssl_context()
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    assert Access(insecure=True).ssl_context() is insecure  # built once, not per request
    for flags, message in (
        (("--ca-cert", "missing.pem"), "--ca-cert missing.pem: no such file"),
        (("--header", "NoColonHere"), "expected 'Name: value'"),
    ):
        result = run(tmp_path, "http://127.0.0.1:9", prompts(1), *flags)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def sharegpt_file(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "human", "value": "Tell me a story."},
                {"from": "gpt", "value": "x" * 40},
            ]
        }
    ]
    (tmp_path / "sg.json").write_text(json.dumps(data), encoding="utf-8")


def test_sharegpt_without_tokenize_estimates_reply_length_and_warns(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    sharegpt_file(tmp_path)
    result = run(tmp_path, server.url, '[workload.dataset]\nkind = "sharegpt"\npath = "sg.json"')
    assert result.returncode == 0, result.stderr
    assert "estimated at ~4 characters per token" in result.stderr
    assert [row["max_tokens"] for row in server.stop()["finished"]] == [10]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["variants"]["A"]["reply_lengths"] == "estimated"


def test_warmup_is_a_phase_that_ends_before_the_metrics_window_and_the_measured_requests(
    tmp_path: Path, paced
) -> None:
    """Warmup sent beside the measured requests would share the cold first batch instead of absorbing
    it, and a /metrics window opened before it would count warmup the figures leave out (both seen on
    the H200: a false crossover and a false acceptance_length_mismatch)."""
    server = paced(interval_ms=2.0)
    path = scenario(
        tmp_path, f"{prompts(4)}\nnum_requests = 6\nmax_tokens = 8\nconcurrency = 3\nwarmup_requests = 3"
    )
    opened: list[int] = []

    class Window(WindowHook):
        def opened(self, variant: str, base_url: str, folder: RunFolder) -> dict[str, Any]:
            opened.append(time.monotonic_ns())
            return {"before": {"at": opened[-1]}}

    outcome = run_scenario(load_scenario(path), url=server.url, run_dir=tmp_path / "run", hooks=[Window()])
    server.stop()
    records = [RequestRecord.from_json(line) for line in iter_jsonl(outcome.run_dir / "requests.jsonl")]
    warm = [r for r in records if r.warmup]
    measured = [r for r in records if not r.warmup]
    assert len(warm) == 3 and len(measured) == 6 and len(opened) == 1
    warm_ended = max(r.sent_monotonic_ns + r.e2e_ms * 1e6 for r in warm)
    assert warm_ended <= opened[0] <= min(r.sent_monotonic_ns for r in measured)
    meta = json.loads((outcome.run_dir / "meta.json").read_text())["variants"]["A"]
    assert meta["before"] == {"at": opened[0]}
    assert len(meta["warmup_workers"]) >= 1 and len(meta["workers"]) >= 1
