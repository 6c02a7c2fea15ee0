"""Every report says where its figures come from, and a simulated run says it is simulated
everywhere: /version and /v1/models, meta.json, the ledger, the terminal block and the report."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from simkit import itlaudit, sim_server

from itlaudit import __version__
from itlaudit.model.run_context import server_build
from itlaudit.serve.sim import SIM_VERSION, SimConfig, run_sim

API_KEY = "sk-context-test-0123456789"


async def test_the_simulator_says_it_is_the_simulator() -> None:
    config = SimConfig()
    async with run_sim(config) as url, aiohttp.ClientSession() as session:
        async with session.get(f"{url}/version") as resp:
            version = (await resp.json())["version"]
        async with session.get(f"{url}/v1/models") as resp:
            (card,) = (await resp.json())["data"]
    assert version == SIM_VERSION == f"itlaudit-sim {__version__}"
    assert card["owned_by"] == "itlaudit-sim"
    assert config.system_fingerprint.startswith(f"itlaudit-sim-{__version__}-")
    assert server_build(version) == f"itlaudit simulator (itlaudit-sim {__version__}), not vLLM"
    assert server_build("0.32.0") == "vLLM 0.32.0" and server_build(None) == "unknown (no /version)"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """One flags-only run against the simulator, with a label, metadata and an API key to mask."""
    where = tmp_path_factory.mktemp("context")
    with sim_server(SimConfig(num_speculative_tokens=3, step_ms=5.0)) as url:
        done = itlaudit(
            *("run", "--url", url, "--dataset-name", "random", "--random-input-len", "8"),
            *("--random-output-len", "16", "--num-prompts", "4", "--max-concurrency", "2"),
            *("--label", "nightly", "--metadata", "gpu=none", "--api-key", API_KEY),
            *("--out", str(where / "run"), "--ledger", str(where / "ledger.jsonl")),
        )
    assert done.returncode == 0, done.stderr
    return where, done.stdout, {"url": url}


def test_report_md_starts_with_the_runs_context(run: tuple[Path, str, dict[str, Any]]) -> None:
    where, _, info = run
    text = (where / "run" / "report.md").read_text()
    head = text.split("\n## ")[0]
    facts = dict(re.findall(r"^> - \*\*(.+?)\*\*: (.*)$", head, re.MULTILINE))
    assert list(facts)[:2] == ["date", "itlaudit"] and facts["itlaudit"] == __version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", facts["date"])
    assert facts["command"].startswith("itlaudit run --url ") and API_KEY not in text
    assert (facts["label"], facts["metadata"]) == ("nightly", "gpu=none")
    assert facts["server server"].startswith(
        f"{info['url']}: itlaudit simulator (itlaudit-sim {__version__}), not vLLM"
    )
    assert facts["model"] == "sim-tiny"
    assert facts["workload"].startswith(
        "4 requests, max concurrency 2, request rate inf (closed loop), random dataset"
    )
    assert "input 8 tokens" in facts["workload"] and "max\\_tokens 16" in facts["workload"]
    assert re.match(r"stamps: (kernel|loop) \(4 requests\); 1 capture process$", facts["capture"])
    assert "GPUs (local nvidia-smi)" in facts and "host" in facts
    # Pooled against per-request: the report says which figure is which.
    assert "## Result" in text and "pooled over every gap of every request" in text
    assert "| P99 ITL per token (ms) |" in text and "| P99 ITL per chunk (vllm bench's ITL) (ms) |" in text
    assert text.index("## Result") < text.index("## Per-request figures")


def test_report_html_carries_the_same_context(run: tuple[Path, str, dict[str, Any]]) -> None:
    where, _, _ = run
    page = (where / "run" / "report.html").read_text()
    context = re.search(r'<ul class="context">(.*?)</ul>', page)
    assert context is not None
    text = html.unescape(re.sub(r"<[^>]+>", "", context.group(1)))
    assert "itlaudit simulator" in text and "not vLLM" in text and "label: nightly" in text
    assert page.index('class="context"') < page.index('class="headline"')
    assert API_KEY not in page


def test_a_simulated_run_is_recorded_as_simulated(run: tuple[Path, str, dict[str, Any]]) -> None:
    where, terminal, _ = run
    meta = json.loads((where / "run" / "meta.json").read_text())
    environment = meta["variants"]["server"]["environment"]
    assert environment["simulated"] is True and environment["vllm_version"] is None
    assert environment["server_version"] == SIM_VERSION
    assert meta["workload"]["num_prompts"] == 4 and meta["workload"]["max_concurrency"] == 2
    (line,) = [json.loads(x) for x in (where / "ledger.jsonl").read_text().splitlines()]
    build = line["fingerprint_parts"]["build"]
    assert build["version"] == SIM_VERSION and not build["system_fingerprint"].startswith("vllm-")
    # The terminal names it, and both reports by absolute path.
    assert "itlaudit simulator" in terminal
    reports = [x.removeprefix("report: ") for x in terminal.splitlines() if x.startswith("report: ")]
    assert reports == [str((where / "run" / name).resolve()) for name in ("report.md", "report.html")]
