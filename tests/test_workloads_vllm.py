"""Workloads against a real vLLM CPU server started with --api-key: readiness, preflight and streams
all carry the key, and a random dataset's prompts are exactly input_len tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_server import server_spec

from itlaudit.model.access import Access
from itlaudit.serve.launcher import launch
from itlaudit.store.jsonl import iter_jsonl

pytestmark = pytest.mark.vllm

KEY = "sk-itlaudit-vllm-test-0123456789"


@pytest.fixture(scope="module")
def keyed_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module; launch() must send the key to pass its readiness check, since vLLM
    answers /v1/models with 401 without it."""
    spec = server_spec(["--api-key", KEY])
    spec.env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with launch(spec, log, Access(headers=(("Authorization", f"Bearer {KEY}"),))) as server:
        yield server.url


def run(tmp_path: Path, url: str, workload: str, variant: str = "") -> subprocess.CompletedProcess[str]:
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\nendpoint = "completions"\n[workload]\n{workload}\n[[variants]]\nname = "A"\n{variant}',
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "VLLM_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", "run", str(path), "--url", url, "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "VLLM_API_KEY": KEY},
    )


def test_a_server_launched_with_api_key_is_measured_and_the_key_is_in_no_file(
    tmp_path: Path, keyed_url: str
) -> None:
    result = run(
        tmp_path,
        keyed_url,
        'prompts = ["Hello"]\nnum_requests = 2\nmax_tokens = 8\nignore_eos = true',
        "reset_prefix_cache = true\n",
    )
    assert result.returncode == 0, result.stderr
    records = list(iter_jsonl(tmp_path / "run" / "requests.jsonl"))
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["completion_tokens"] == 8 for r in records)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["variants"]["A"]["reset_prefix_cache"] == {"done": True}
    assert meta["variants"]["A"]["environment"]["vllm_version"]  # /version answered with the key
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def test_a_random_dataset_sends_exactly_input_len_prompt_tokens(tmp_path: Path, keyed_url: str) -> None:
    workload = 'num_requests = 4\nconcurrency = 2\nseed = 5\n[workload.dataset]\nkind = "random"\n'
    workload += "input_len = 37\noutput_len = 9"
    result = run(tmp_path, keyed_url, workload)
    assert result.returncode == 0, result.stderr
    records = list(iter_jsonl(tmp_path / "run" / "requests.jsonl"))
    assert len(records) == 4
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in records] == [(37, 9)] * 4


def test_sharegpt_reply_lengths_come_from_the_servers_tokenize(tmp_path: Path, keyed_url: str) -> None:
    reply = "The quick brown fox jumps over the lazy dog. " * 3
    data = [
        {"conversations": [{"from": "human", "value": "Say something."}, {"from": "gpt", "value": reply}]}
    ]
    (tmp_path / "sg.json").write_text(json.dumps(data), encoding="utf-8")
    request = urllib.request.Request(
        f"{keyed_url}/tokenize",
        data=json.dumps({"model": "tiny", "prompt": reply, "add_special_tokens": False}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        count = json.loads(resp.read())["count"]
    assert count != len(reply) // 4  # else this test could not tell the count from the estimate
    result = run(
        tmp_path, keyed_url, 'max_tokens = 1\n[workload.dataset]\nkind = "sharegpt"\npath = "sg.json"'
    )
    assert result.returncode == 0, result.stderr
    records = list(iter_jsonl(tmp_path / "run" / "requests.jsonl"))
    assert [r["params"]["max_tokens"] for r in records] == [count]
    assert "estimated" not in result.stderr
