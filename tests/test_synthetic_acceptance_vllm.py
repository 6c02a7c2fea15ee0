"""vLLM 0.32 CPU with synthetic acceptance (issue 35 item 2): its config accepts
`rejection_sample_method = "synthetic"`, but the CPU sampler refuses it at the first request and the
engine dies. The run names the cause in one line, from the launched server's log (its worker's
AssertionError, behind vLLM's EngineDeadError and RuntimeError that point back to it), records it in
meta.json beside the speculative config it read from the server's arguments, and judges the variant
not comparable. CI cost: ~45 s (the server's start and its death at the first request)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_server import BASE_ARGS, ENV, SERVED_MODEL, tiny_model
from vllm_server import testbed_python as vllm_python  # not test_-named: pytest would collect it

from itlaudit.serve.launcher import engine_error

pytestmark = pytest.mark.vllm

SYNTHETIC = {
    "method": "draft_model", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 3.5,
}  # fmt: skip


def test_a_cpu_engine_that_refuses_synthetic_acceptance_is_one_line(tmp_path: Path) -> None:
    config = json.dumps({**SYNTHETIC, "model": str(tiny_model())})
    args = json.dumps([*BASE_ARGS, "--speculative-config", config])
    env = ", ".join(f'{k} = "{v}"' for k, v in ENV.items())
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'name = "synthetic"\nendpoint = "completions"\nmodel = "{SERVED_MODEL}"\n[workload]\n'
        'prompts = ["hello there"]\nnum_requests = 2\nmax_tokens = 16\nignore_eos = true\ntemperature = 0\n'
        f'[[variants]]\nname = "K3S"\n[variants.launch]\nkind = "python"\npython = "{vllm_python()}"\n'
        f'model = "{tiny_model()}"\nserved_model_name = "{SERVED_MODEL}"\nserver_args = {args}\n'
        f"env = {{ {env} }}\n"
    )
    argv = [
        sys.executable,
        "-m",
        "itlaudit",
        "run",
        str(scenario),
        "--out",
        str(tmp_path / "run"),
        "--no-plots",
    ]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    cause = "AssertionError: Synthetic acceptance not supported with CPU sampling"
    said = [line for line in done.stderr.splitlines() if cause in line]
    assert len(said) == 1 and said[0].startswith("K3S: requests failed"), done.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "meta.json").read_text())["variants"]["K3S"]
    assert info["server_error"] == cause
    assert info["speculative_config"]["rejection_sample_method"] == "synthetic"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["synthetic_acceptance"] == {"K3S": "acceptance length 3.5 forced"}


def test_a_log_without_an_exception_names_none(tmp_path: Path) -> None:
    """The quiet side: a server log that ends in ordinary lines has no cause to name. ~0 s."""
    log = tmp_path / "server.log"
    log.write_text("INFO 12-07 03:30:59 [api_utils.py:286] non-default args: {}\nINFO Started server\n")
    assert engine_error(log) is None
