"""`itlaudit run` end to end against the simulator, one server process per fault, through the real
CLI entry point: exit codes, files on disk, and the finding each fault must raise (and no other)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from itlaudit.bisect.settings import DEFAULT_SCENARIO
from itlaudit.cli.run import DEMO_SCENARIO
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.scenario import load_scenario
from itlaudit.serve.launcher import launch

CLEAN_WORKLOAD = 'prompts = ["hi"]\nnum_requests = 3\nconcurrency = 2\nmax_tokens = 40\ntemperature = 0'


@pytest.fixture()
def sim(tmp_path: Path) -> Iterator[object]:
    """Factory: start `itlaudit sim` with extra flags in its own process (timing not shared with us).
    5 ms steps: at 2 ms a loaded 2-core machine merges chunks into one read (chunks_coalesced)."""
    servers = []

    def start(*flags: str) -> str:
        spec = LaunchSpec(
            kind="command",
            command=[sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "5", *flags],
            ready_timeout_s=30,
        )
        server = launch(spec, tmp_path / f"sim-{len(servers)}.log")
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def itlaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def scenario(tmp_path: Path, url: str, workload: str = CLEAN_WORKLOAD, endpoint: str = "completions") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\nendpoint = "{endpoint}"\n\n[workload]\n{workload}\n\n'
        f'[[variants]]\nname = "A"\nurl = "{url}"\n',
        encoding="utf-8",
    )
    return path


def run_codes(
    tmp_path: Path, url: str, workload: str = CLEAN_WORKLOAD, endpoint: str = "completions"
) -> set[str]:
    result = itlaudit(
        "run", str(scenario(tmp_path, url, workload, endpoint)), "--out", str(tmp_path / "run"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(lines) == summary["variants"]["A"]["requests"] == 3
    for name in ("requests.csv", "report.md", "meta.json"):
        assert (tmp_path / "run" / name).is_file()
    return set(summary["variants"]["A"]["findings"])


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_clean_server_no_findings_and_k3_inflation(sim, tmp_path: Path, endpoint: str) -> None:
    url = sim("--num-speculative-tokens", "3")
    assert run_codes(tmp_path, url, endpoint=endpoint) == set()
    block = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]
    # 40 tokens: 1 prefill token then chunks of 4 (last one 3): 39 decode tokens over 10 chunks
    assert block["decode_tokens_per_chunk"]["p50"] == pytest.approx(3.9)
    assert block["itl_inflation"]["p50"] == pytest.approx(3.9)
    assert block["completion_tokens"]["p50"] == 40


FORCED = (
    'prompts = ["hi"]\nnum_requests = 3\nmax_tokens = 40\nmin_tokens = 40\nignore_eos = true\ntemperature = 0'
)


@pytest.mark.fault_row("1")
@pytest.mark.fault_row("11")
@pytest.mark.parametrize(
    ("flags", "workload", "expected"),
    [
        (["--cap-tokens", "16"], FORCED, {"truncated_below_max_tokens", "min_tokens_violated", "common_cap"}),
        (
            ["--drop-ignore-eos", "--natural-eos-at", "10"],
            FORCED.replace("min_tokens = 40\n", ""),
            {"ignore_eos_violated"},
        ),
        (
            ["--ignore-min-tokens", "--natural-eos-at", "10"],
            FORCED.replace("ignore_eos = true\n", ""),
            {"min_tokens_violated"},
        ),
        (["--drop-usage"], CLEAN_WORKLOAD, {"usage_missing"}),
        (["--error-after-tokens", "8"], CLEAN_WORKLOAD, {"stream_error"}),
        (["--reset-after-tokens", "8"], CLEAN_WORKLOAD, {"connection_error"}),
        (["--omit-done"], CLEAN_WORKLOAD, {"no_done_sentinel"}),
        (
            ["--gibberish-after-tokens", "40"],
            CLEAN_WORKLOAD.replace("max_tokens = 40", "max_tokens = 200"),
            {"gibberish_suspected"},
        ),
    ],
    ids=["cap", "ignore_eos", "min_tokens", "drop_usage", "error_frame", "reset", "no_done", "gibberish"],
)
def test_each_fault_raises_its_finding(
    sim, tmp_path: Path, flags: list[str], workload: str, expected: set
) -> None:
    assert run_codes(tmp_path, sim(*flags), workload) == expected


def test_ignored_stop_token_ids(sim, tmp_path: Path) -> None:
    url = sim()
    # Find a token the simulator emits at temperature 0, then ask it to stop there.
    assert run_codes(tmp_path, url) == set()
    first = json.loads((tmp_path / "run" / "requests.jsonl").read_text().splitlines()[0])
    stop_id = [i for ids in first["chunk_token_ids"] if ids for i in ids][5]
    workload = CLEAN_WORKLOAD + f"\nstop_token_ids = [{stop_id}]"
    (tmp_path / "honoured").mkdir()
    assert run_codes(tmp_path / "honoured", url, workload) == set()
    faulty = sim("--ignore-stop-token-ids")
    (tmp_path / "ignored").mkdir()
    assert run_codes(tmp_path / "ignored", faulty, workload) == {"stop_token_ids_ignored"}


def test_fail_on_findings_exit_code(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim("--cap-tokens", "16"), FORCED)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "r"), "--fail-on-findings", cwd=tmp_path)
    assert result.returncode == 1
    clean = scenario(tmp_path, sim(), CLEAN_WORKLOAD)
    assert (
        itlaudit(
            "run", str(clean), "--out", str(tmp_path / "c"), "--fail-on-findings", cwd=tmp_path
        ).returncode
        == 0
    )


def _one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # Progress lines (report/progress) may come first, once requests were sent; the error is the last.
    text = " ".join(result.stderr.split("\nitlaudit: error:")[-1].split())
    assert ("\n" + result.stderr).count("\nitlaudit: error:") == 1, result.stderr
    for needle in needles:
        assert needle in text, text


def test_http_400_shows_vllms_message_and_keeps_the_record(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim(), 'prompts = ["hi"]\nnum_requests = 2\nmax_tokens = 999999')
    result = itlaudit("run", str(path), "--out", str(tmp_path / "r"), cwd=tmp_path)
    _one_line_error(result, "HTTP 400", "max_tokens")
    kept = (tmp_path / "r" / "requests.jsonl").read_text().splitlines()
    assert kept and json.loads(kept[0])["status"] == "http_error"


def test_unknown_model_and_unreachable_server(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim())
    path.write_text(
        path.read_text().replace('endpoint = "completions"', 'endpoint = "completions"\nmodel = "nope"')
    )
    _one_line_error(
        itlaudit("run", str(path), "--out", str(tmp_path / "a"), cwd=tmp_path), "'nope' is not served"
    )
    dead = scenario(tmp_path, "http://127.0.0.1:9")
    _one_line_error(itlaudit("run", str(dead), "--out", str(tmp_path / "b"), cwd=tmp_path), "127.0.0.1:9")


def test_bad_scenario_and_bad_variant_flag(tmp_path: Path) -> None:
    _one_line_error(itlaudit("run", str(tmp_path / "missing.toml"), cwd=tmp_path), "scenario file not found")
    path = scenario(
        tmp_path, "http://127.0.0.1:9", CLEAN_WORKLOAD.replace("max_tokens = 40", "max_tokens = -1")
    )
    _one_line_error(itlaudit("run", str(path), cwd=tmp_path), "s.toml:8:", "`workload.max_tokens`")
    good = scenario(tmp_path, "http://127.0.0.1:9")
    _one_line_error(
        itlaudit("run", str(good), "--variant", "B=http://x:1", cwd=tmp_path), "not in the scenario"
    )
    _one_line_error(itlaudit("run", str(good), "--variant", "nourl", cwd=tmp_path), "NAME=http")


def test_report_rederives_from_requests_jsonl(sim, tmp_path: Path) -> None:
    run_codes(tmp_path, sim("--cap-tokens", "16"), FORCED)
    run_dir = tmp_path / "run"
    before = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()
    (run_dir / "report.md").unlink()
    result = itlaudit("report", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "summary.json").read_text()) == before
    assert "common_cap" in (run_dir / "report.md").read_text()


def test_repeated_experiment_is_named_and_refused_only_with_no_repeat(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim())
    first = itlaudit("run", str(path), "--out", str(tmp_path / "first"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = itlaudit("run", str(path), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    (warning,) = [line for line in again.stderr.splitlines() if "same experiment" in line]
    assert "run 'first'" in warning
    assert f"`itlaudit diff {tmp_path / 'first'} {tmp_path / 'again'}`" in warning
    refused = itlaudit("run", str(path), "--out", str(tmp_path / "refused"), "--no-repeat", cwd=tmp_path)
    _one_line_error(refused, "'first'", "--no-repeat")
    assert not (tmp_path / "refused" / "requests.jsonl").read_text()
    reused = itlaudit("run", str(path), "--out", str(tmp_path / "refused"), cwd=tmp_path)
    assert reused.returncode == 0, reused.stderr  # a refused start holds no run: the folder is reusable
    forced = itlaudit(
        "run", str(path), "--out", str(tmp_path / "forced"), "--no-repeat", "--force", cwd=tmp_path
    )
    assert forced.returncode == 0, forced.stderr
    lines = [json.loads(line) for line in (tmp_path / "reports" / "ledger.jsonl").read_text().splitlines()]
    assert [(line["run_id"], line["repeat_of"]) for line in lines] == [
        ("first", None),
        ("again", "first"),
        ("refused", "first"),
        ("forced", "first"),
    ]


def test_same_scenario_against_a_second_server_is_another_experiment(sim, tmp_path: Path) -> None:
    """The fingerprint holds the URL: the same build on two machines is two experiments."""
    first = itlaudit("run", str(scenario(tmp_path, sim())), "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = itlaudit("run", str(scenario(tmp_path, sim())), "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "same experiment" not in second.stderr


def test_compare_explains_a_greedy_divergence_with_both_top_logprobs(sim, tmp_path: Path) -> None:
    k0, k3 = sim(), sim("--num-speculative-tokens", "3", "--natural-eos-at", "7")
    path = tmp_path / "c.toml"
    path.write_text(
        'name = "c"\nendpoint = "completions"\n\n[workload]\nprompts = ["hi"]\nnum_requests = 1\n'
        'max_tokens = 20\ntemperature = 0\n\n[[variants]]\nname = "K0"\n\n[[variants]]\nname = "K3"\n',
        encoding="utf-8",
    )
    result = itlaudit(
        "compare",
        str(path),
        "--variant",
        f"K0={k0}",
        "--variant",
        f"K3={k3}",
        "--out",
        str(tmp_path / "c"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    comparison = json.loads((tmp_path / "c" / "compare.json").read_text())
    (found,) = [f for f in comparison["findings"] if f["code"] == "spec_decode_output_mismatch"]
    assert found["evidence"]["position"] == 7
    assert found["evidence"]["base_top_logprobs"] and found["evidence"]["spec_top_logprobs"]
    assert "spec_decode_output_mismatch" in result.stdout


def test_the_packaged_scenarios_the_commands_default_to_exist_and_load() -> None:
    """`itlaudit demo` and a bare `itlaudit bisect` read scenarios shipped in itlaudit/data: a package
    move once left the demo pointing at a folder that does not exist. The bisect one is read as bisect
    reads it: its launch tables name no kind, the provider starts the servers."""
    assert load_scenario(DEMO_SCENARIO).variants
    assert load_scenario(DEFAULT_SCENARIO, provided=True).variants


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]


def test_flags_only_run_sends_the_flags_workload_and_saves_it(sim, tmp_path: Path) -> None:
    """No scenario file: vllm bench serve's flags are the workload; the records carry it, meta.json
    the command line (key masked), label and metadata; --save-scenario loads back to the same workload."""
    url = sim()
    result = itlaudit(
        "run",
        "--url",
        url,
        *("--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "24"),
        *("--num-prompts", "5", "--max-concurrency", "2", "--temperature", "0"),
        *("--label", "nightly", "--metadata", "gpu=h200", "--metadata", "tp=1"),
        *("--api-key", "sk-not-a-real-key-1234", "--save-scenario", "saved.toml"),
        *("--save-result", "result.json"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    assert run_dir.name.startswith("random-12-24-")  # named after the workload, not "run"
    records = _records(run_dir)
    assert len(records) == 5
    assert {(r["prompt_tokens"], r["completion_tokens"]) for r in records} == {(12, 24)}
    assert {
        (r["params"]["max_tokens"], r["params"]["ignore_eos"], r["params"]["temperature"]) for r in records
    } == {(24, True, 0.0)}
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["label"] == "nightly" and meta["metadata"] == {"gpu": "h200", "tp": "1"}
    assert meta["command_line"].startswith("itlaudit run --url ")
    assert "sk-not-a-real-key-1234" not in (run_dir / "meta.json").read_text()
    saved_result = json.loads((tmp_path / "result.json").read_text())
    assert saved_result["label"] == "nightly" and saved_result["gpu"] == "h200"
    assert saved_result["completed"] == 5 and saved_result["total_output_tokens"] == 5 * 24
    assert f"result: {(tmp_path / 'result.json').resolve()}" in result.stdout  # paths printed one way
    saved = load_scenario(tmp_path / "saved.toml")
    assert (saved.workload.num_requests, saved.workload.concurrency) == (5, 2)
    assert saved.variants[0].url == url
    assert saved.workload.dataset is not None
    assert [len(e.prompt or []) for e in saved.workload.dataset.entries] == [12] * 5


def test_flags_replace_a_scenarios_keys(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim())  # 3 requests of at most 40 tokens
    result = itlaudit(
        "run",
        str(path),
        "--num-prompts",
        "2",
        "--max-tokens",
        "16",
        "--out",
        str(tmp_path / "r"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    records = _records(tmp_path / "r")
    assert len(records) == 2
    assert {r["params"]["max_tokens"] for r in records} == {16}
    assert {r["completion_tokens"] for r in records} == {16}


def test_run_folder_is_named_after_the_scenario_file(sim, tmp_path: Path) -> None:
    path = scenario(tmp_path, sim())  # s.toml, whose name key is "t"
    result = itlaudit("run", str(path), "--num-prompts", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "reports").iterdir() if p.is_dir()] == ["s"]


def test_url_without_scheme_and_no_server_are_one_line(tmp_path: Path) -> None:
    _one_line_error(itlaudit("run", "--url", "localhost:8000", cwd=tmp_path), "URL needs http:// or https://")
    _one_line_error(itlaudit("run", cwd=tmp_path), "give a SCENARIO file, or a server")
    _one_line_error(
        itlaudit("run", "--url", "http://127.0.0.1:9", "--dataset-name", "jsonl", cwd=tmp_path),
        "--dataset-name jsonl needs --dataset-path FILE",
    )


def test_flags_only_compare_takes_a_server_per_variant(sim, tmp_path: Path) -> None:
    k0, k3 = sim(), sim("--num-speculative-tokens", "3")
    result = itlaudit(
        "compare",
        *("--variant", f"K0={k0}", "--variant", f"K3={k3}"),
        *("--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "17"),
        *("--num-prompts", "2", "--out", str(tmp_path / "c")),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    comparison = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert list(comparison["variants"]) == ["K0", "K3"]
    records = _records(tmp_path / "c")
    assert sorted((r["variant"], r["url"].rsplit("/v1", 1)[0]) for r in records) == sorted(
        [("K0", k0)] * 2 + [("K3", k3)] * 2
    )
