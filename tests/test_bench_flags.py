"""A `vllm bench serve` line pasted after `itlaudit run` (cli/bench_flags): it runs against a simulator
with vllm bench's meanings — --base-url, --backend, --endpoint as a path, --header KEY=VALUE,
--served-model-name, the boolean --save-result with --result-dir and vllm bench's own file name — and
--goodput, the percentile options, --random-prefix-len, --save-detailed and --append-result as vllm
bench writes them; an option itlaudit has no meaning for is one line, exit 2. ~4 s."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from simkit import itlaudit, sim_server

from itlaudit.serve.sim import SimConfig


def test_a_pasted_vllm_bench_line_runs_and_saves_its_result_as_vllm_bench_names_it(tmp_path: Path) -> None:
    with sim_server(SimConfig(step_ms=1.0, ttft_ms=2.0)) as url:
        done = itlaudit(
            "run", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", "org/sim-tiny", "--served-model-name", "sim-tiny", "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "4",
            "--max-concurrency", "2", "--header", "X-Team=perf", "--save-result", "--result-dir",
            str(tmp_path / "results"), "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "99",
            "--disable-tqdm", "--trust-remote-code", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--disable-tqdm: accepted, itlaudit prints its own progress" in done.stderr
    (saved,) = (tmp_path / "results").iterdir()
    assert re.fullmatch(r"openai-infqps-concurrency2-sim-tiny-\d{8}-\d{6}\.json", saved.name), saved.name
    result = json.loads(saved.read_text())
    assert result["completed"] == 4 and result["model_id"] == "sim-tiny"
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    (variant,) = meta["variants"].values()
    assert variant["headers"] == ["X-Team"] and meta["endpoint"] == "completions"


def test_goodput_percentiles_prefix_and_detailed_arrays_as_vllm_bench_gives_them(tmp_path: Path) -> None:
    """vllm bench's --goodput KEY:VALUE, --metric-percentiles/--percentile-metrics (the block's rows
    and the result's keys), --random-prefix-len, --save-detailed's arrays and --append-result (two
    runs, two JSON lines): an SLO every request meets gives goodput = throughput, one none meets 0."""
    common = (
        "--dataset-name", "random", "--random-input-len", "24", "--random-prefix-len", "8",
        "--random-output-len", "16", "--num-prompts", "4", "--max-concurrency", "2",
        "--metric-percentiles", "90,95", "--percentile-metrics", "ttft,tpot,itl", "--save-result",
        "--save-detailed", "--append-result", "--result-dir", str(tmp_path), "--result-filename", "r.json",
    )  # fmt: skip
    with sim_server(SimConfig(step_ms=1.0, ttft_ms=2.0)) as url:
        met = itlaudit("run", "--base-url", url, *common, "--goodput", "tpot:1000", "e2el:60000")
        missed = itlaudit("run", "--base-url", url, *common, "--goodput", "ttft:0.001")
    assert met.returncode == 0 and missed.returncode == 0, met.stderr + missed.stderr
    rows = {line[:40].strip(): line[41:].strip() for line in met.stdout.splitlines() if len(line) > 41}
    assert {"P90 TTFT (ms):", "P95 TPOT (ms):", "P95 ITL (ms):", "Request goodput (req/s):"} <= set(rows)
    assert "P99 TTFT (ms):" not in rows and "End-to-end Latency" not in met.stdout
    first, second = (json.loads(line) for line in (tmp_path / "r.json").read_text().splitlines())
    assert first["request_goodput"] == first["request_throughput"] > 0 and second["request_goodput"] == 0
    assert first["p95_ttft_ms"] >= first["p90_ttft_ms"] > 0 and "p95_e2el_ms" in first
    # --save-detailed: one entry a request, in vllm bench's units; a prompt is prefix + input tokens
    assert first["input_lens"] == [32] * 4 and first["output_lens"] == [16] * 4
    assert [len(gaps) for gaps in first["itls"]] == [15] * 4 and all(0 < t < 1 for t in first["ttfts"])
    assert first["errors"] == [""] * 4 and len(first["generated_texts"]) == len(first["start_times"]) == 4


def test_an_option_with_no_itlaudit_meaning_is_one_line() -> None:
    done = itlaudit("run", "--base-url", "http://127.0.0.1:9", "--no-stream")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "itlaudit: error: --no-stream: not accepted: itlaudit measures streamed completions: run without "
        "--no-stream"
    )


@pytest.mark.fault_row("R7")
@pytest.mark.parametrize("option", ["--save-result", "--ledger"])
def test_a_result_file_that_cannot_be_written_is_refused_before_the_first_request(
    tmp_path: Path, option: str
) -> None:
    """issue 39 item 5: --save-result naming a folder was refused only after the whole run, and so was
    a --ledger under a file (with a wrong hint). The server here does not answer: the line comes before
    anything is sent; a writable file passes the check (and then meets the unreachable server).
    ~2 s each."""
    (tmp_path / "results").mkdir()
    (tmp_path / "a-file").write_text("")
    for target, said in (
        (tmp_path / "results", "a folder"),
        (tmp_path / "a-file" / "r.json", "not a folder"),
    ):
        done = itlaudit("run", "--url", "http://127.0.0.1:9", option, str(target))
        assert done.returncode == 2 and said in done.stderr and "cannot reach" not in done.stderr, done.stderr
        assert (
            done.stderr.startswith(f"itlaudit: error: {option} {target}: ") and done.stderr.count("\n") == 1
        )
    done = itlaudit("run", "--url", "http://127.0.0.1:9", option, str(tmp_path / "results" / "r.json"))
    assert done.returncode == 2 and "cannot reach" in done.stderr


def test_itlaudit_own_spellings_pass_through_beside_vllm_benchs() -> None:
    """itlaudit's `--header 'Name: value'`, `--save-result FILE` and `--endpoint chat` keep their
    meaning (a SCENARIO after them stays the scenario); vllm bench's KEY=VALUE lists become one option
    each; --host/--port make the URL."""
    from itlaudit.cli.bench_flags import bench_argv

    assert bench_argv(["--header", "A: b", "s.toml"]).argv == ["--header", "A: b", "s.toml"]
    assert bench_argv(["--header", "Cookie: a=b", "s.toml"]).argv == ["--header", "Cookie: a=b", "s.toml"]
    assert bench_argv(["--header", "A=b", "C=d", "s.toml"]).argv == [
        "--header",
        "A: b",
        "--header",
        "C: d",
        "s.toml",
    ]
    assert bench_argv(["--metadata", "a=b", "c=d"]).argv == ["--metadata", "a=b", "--metadata", "c=d"]
    assert bench_argv(["--save-result", "r.json", "s.toml"]).argv == ["--save-result", "r.json", "s.toml"]
    assert bench_argv(["--endpoint", "chat"]).argv == ["--endpoint", "chat"]
    assert bench_argv(["--host", "gb10", "--port", "8001"]).argv == ["--url", "http://gb10:8001"]
    assert bench_argv(["--model", "org/m", "--served-model-name", "m"]).argv == ["--model", "m"]


def test_a_local_tokenizer_is_passed_and_a_hub_name_noted(tmp_path: Path) -> None:
    """vllm bench's --tokenizer: a local folder is itlaudit's --tokenizer; a hub name (what CI lines
    give) is accepted with its note, since itlaudit downloads nothing; a scenario's tokenizer that has
    no tokenizer.json is one line naming the key."""
    from itlaudit.cli.bench_flags import bench_argv

    assert bench_argv(["--tokenizer", str(tmp_path)]).argv == ["--tokenizer", str(tmp_path)]
    line = bench_argv(["--tokenizer", "meta-llama/Llama-3.1-8B-Instruct"])
    assert line.argv == [] and line.notes[0].startswith(
        "--tokenizer meta-llama/Llama-3.1-8B-Instruct: accepted"
    )
    done = itlaudit("run", "--url", "http://127.0.0.1:9", "--tokenizer", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tokenizer" in done.stderr and "no tokenizer.json there" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_sampling_options_become_the_body_keys_vllm_bench_sends() -> None:
    """--top-p, --top-k, … and --extra-body / --chat-template-kwargs merge into one itlaudit
    --extra-body, which the scenario parser bounds as it bounds a file's [workload.extra_body]."""
    import pytest

    from itlaudit.cli.bench_flags import bench_argv
    from itlaudit.errors import ScenarioError
    from itlaudit.model.scenario import ScenarioFlags, build_scenario

    argv = ["--top-p", "0.9", "--top-k", "20", "--extra-body", '{"min_p": 0.05}']
    argv += ["--chat-template-kwargs", '{"enable_thinking": false}']
    assert bench_argv(argv).argv == [
        "--extra-body",
        '{"top_p": 0.9, "top_k": 20, "min_p": 0.05, "chat_template_kwargs": {"enable_thinking": false}}',
    ]
    body = {"top_p": 0.9, "top_k": 20}
    assert (
        build_scenario(None, ScenarioFlags(url="http://h:1", extra_body=body))[0].workload.extra_body == body
    )
    with pytest.raises(ScenarioError, match="--top-k 'many': give an integer"):
        bench_argv(["--top-k", "many"])
    with pytest.raises(ScenarioError, match=r"top_p: must be a finite number in \(0, 1\], got 7"):
        build_scenario(None, ScenarioFlags(url="http://h:1", extra_body={"top_p": 7}))
