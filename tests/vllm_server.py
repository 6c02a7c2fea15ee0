"""Real vLLM CPU servers for integration tests, shared across test modules.

A server takes 25-50 s to become ready on this class of machine, so tests share one: a module's
fixture asks the session's pool (`POOL`) for a server of its arguments, and modules that ask for the
same arguments (the plain K0 server: four modules; K3: two) get the one already up. The pool keeps at
most two (~2.8 GB each, idle at ~1 % of a core), stopping the least recently asked first, and stops
all of them before a Gemma test (conftest.py: those servers need the memory) and at the session's
end. Usage in a test module::

    import pytest
    from vllm_server import vllm_server  # tests/ is on sys.path under pytest's default import mode

    pytestmark = pytest.mark.vllm
    k3_url = vllm_server(num_speculative_tokens=3)

    def test_something(k3_url: str) -> None: ...

vllm-marked tests are skipped unless pytest runs with ``--vllm`` or ``-m vllm`` (see conftest.py),
because they install a multi-GB testbed on first use and load both cores for minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from itlaudit.cli.testbed import default_model_dir
from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.launcher import launch
from itlaudit.serve.testbed import DEFAULT_VERSION, build_model, default_cache_dir, install

SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 2048
READY_TIMEOUT_S = 300.0
BASE_ARGS = ["--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN)]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# Findings a loaded 2-core box may add to any run: a starved API server flushes chunks in bursts
# (chunks_coalesced), a busy client falls behind (client_saturated). Both say so truthfully.
TIMING_FINDINGS = frozenset({"chunks_coalesced", "client_saturated"})


def testbed_python(version: str = DEFAULT_VERSION) -> Path:
    """The testbed venv's python, installing it first if this machine has never had it."""
    return install(version)


def tiny_model(seed: int = 0, draft_noise: float | None = None) -> Path:
    """A tiny model in the shared cache, so every test module and run reuses the same files."""
    name = f"tiny-llama-s{seed}" + (f"-noise{draft_noise:g}" if draft_noise is not None else "")
    return build_model(
        default_cache_dir() / "models" / name, python=testbed_python(), seed=seed, draft_noise=draft_noise
    )


def thinking_model(seed: int = 0) -> Path:
    """The tiny Llama made to think (tinymodel.py --arch think: every greedy chat reply is `<think>`,
    a fixed thinking span, `</think>`, a repeated answer), where `itlaudit testbed build-model` puts it."""
    return build_model(
        default_model_dir(seed, arch="think"), python=testbed_python(), seed=seed, arch="think"
    )


def speculative_args(draft: Path, num_speculative_tokens: int) -> list[str]:
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": num_speculative_tokens}
    return ["--speculative-config", json.dumps(config)]


def server_spec(
    extra_args: list[str],
    *,
    num_speculative_tokens: int = 0,
    draft_noise: float | None = None,
    model_of: Callable[[], Path] = tiny_model,
) -> LaunchSpec:
    """The testbed server: tiny model (or `model_of()`'s), served as "tiny"; K>0 drafts with itself or
    a noisy copy."""
    model = model_of()
    args = [*BASE_ARGS, *extra_args]
    if num_speculative_tokens:
        draft = model if draft_noise is None else tiny_model(draft_noise=draft_noise)
        args += speculative_args(draft, num_speculative_tokens)
    return LaunchSpec(
        kind="python",
        python=str(testbed_python()),
        model=str(model),
        served_model_name=SERVED_MODEL,
        server_args=args,
        env=dict(ENV),
        ready_timeout_s=READY_TIMEOUT_S,
    )


class ServerPool:
    """The session's testbed servers, by launch spec: at most KEEP up at once."""

    KEEP = 2

    def __init__(self) -> None:
        self._up: OrderedDict[str, tuple[ExitStack, str]] = OrderedDict()

    def url(self, spec: LaunchSpec, log_dir: Path) -> str:
        """A server of `spec`: the one up already, or a new one (the least recently asked stopped
        first when KEEP are up)."""
        key = json.dumps([spec.python, spec.model, spec.server_args, spec.env], sort_keys=True)
        if key in self._up:
            self._up.move_to_end(key)
            return self._up[key][1]
        while len(self._up) >= self.KEEP:
            self._up.popitem(last=False)[1][0].close()
        stack = ExitStack()
        server = stack.enter_context(launch(spec, log_dir / "server.log"))
        self._up[key] = (stack, server.url)
        return server.url

    def release(self) -> None:
        """Stop every server (before a test that needs their memory, and at the session's end)."""
        while self._up:
            self._up.popitem()[1][0].close()


POOL = ServerPool()


def vllm_server(
    *extra_args: str,
    num_speculative_tokens: int = 0,
    draft_noise: float | None = None,
    model_of: Callable[[], Path] = tiny_model,
) -> Callable[..., Iterator[str]]:
    """A module-scoped fixture yielding the base URL of a real server started with these args (the
    pool's, shared with other modules that ask for the same); `model_of` (called when the fixture
    starts, not at collection) picks another model."""

    @pytest.fixture(scope="module")
    def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
        spec = server_spec(
            list(extra_args),
            num_speculative_tokens=num_speculative_tokens,
            draft_noise=draft_noise,
            model_of=model_of,
        )
        yield POOL.url(spec, tmp_path_factory.mktemp("vllm"))

    return _server


def tiny_run(
    command: str, url: str, out: Path, *extra: str, output_len: int = 64
) -> subprocess.CompletedProcess[str]:
    """`itlaudit COMMAND` against a testbed server: 2 random prompts of 16 tokens, `output_len` tokens
    out, one at a time, into `out` (no plots), from out's folder; `extra` flags after."""
    argv = [
        sys.executable, "-m", "itlaudit", command, "--url", url, "--model", SERVED_MODEL,
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(output_len),
        "--num-prompts", "2", "--max-concurrency", "1", "--out", str(out), "--no-plots", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, cwd=out.parent, capture_output=True, text=True, timeout=600)


def itl_said(row: dict[str, Any], records: list[dict[str, Any]], category: str | None = None) -> None:
    """A block's token ITL (of `category`'s replies, or of all) is measured (above 0) wherever one of
    its replies spread its tokens over time; where every reply came in one read (a starved API server
    on a loaded 2-core box flushes a short reply whole) it has none, never 0 ms (analysis.metrics)."""
    spans = []
    for record in (r for r in records if category is None or r["category"] == category):
        tokens = [n or 0 for n in record["chunk_tokens"]]  # a role or usage-only chunk counts none
        content = [t for i, t in enumerate(record["chunk_t_ms"]) if tokens[i] > max(tokens[:i], default=0)]
        spans.append(max(content) - min(content) if content else 0.0)
    if any(span > 0 for span in spans):
        assert row["itl_ms"]["p50"] > 0, (category, row)
    else:
        assert row["itl_ms"]["p50"] is None, (category, row)
