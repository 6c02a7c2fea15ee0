"""The workloads past the synthetic (issue 28) against the paced server, which records each request's
arrival time and body: a timed trace replayed on its own schedule, shared prefixes, SpecBench and
SPEED-Bench files with category selection; and each one's bad input as one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pacedkit import itlaudit, lines, run

from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.schedule import send_offsets_s

FIXTURES = Path(__file__).parent / "fixtures" / "workloads"
MOONCAKE = [json.loads(line) for line in (FIXTURES / "mooncake.jsonl").read_text().splitlines()]


def _copy_fixtures(tmp_path: Path) -> None:
    for item in FIXTURES.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy)(item, tmp_path / item.name)


def _parse(tmp_path: Path, workload: str) -> object:
    text = f'name = "t"\nendpoint = "completions"\n[workload]\n{workload}\n[[variants]]\nname = "A"\n'
    return parse_scenario(text, tmp_path / "s.toml")


def test_a_mooncake_trace_arrives_on_its_own_schedule_scaled_and_shares_its_hashed_prefixes(
    tmp_path: Path, paced
) -> None:
    _copy_fixtures(tmp_path)
    server = paced(interval_ms=1.0)
    workload = 'trace_scale = 0.5\n[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"'
    result = run(tmp_path, server.url, workload)
    assert result.returncode == 0, result.stderr
    log = server.stop()
    arrivals = np.array(sorted(log["arrivals"]))
    due = np.array([row["timestamp"] for row in MOONCAKE]) / 1000 * 0.5  # ms, replayed twice as fast
    assert len(arrivals) == len(due)
    np.testing.assert_allclose(arrivals - arrivals[0], due - due[0], atol=0.03)
    by_tokens = {row["max_tokens"]: row["prompt"] for row in log["finished"]}
    # Output lengths are the trace's, and each prompt is exactly its input_length in token ids.
    assert sorted(by_tokens) == sorted(row["output_length"] for row in MOONCAKE)
    for row in MOONCAKE:
        assert len(by_tokens[row["output_length"]]) == row["input_length"]
    # Lines 0 and 1 share hash id 0: their first 512-token block is the same, the next is not.
    first, second = by_tokens[4], by_tokens[3]
    assert first[:512] == second[:512] and first[512:530] != second[512:530]
    assert by_tokens[2] == first[:520]  # line 3 repeats line 0's hash ids: the same prefix, cut
    raw = lines(tmp_path)
    assert [r["scheduled_ms"] for r in sorted(raw, key=lambda r: r["request_id"])] == pytest.approx(
        list(due * 1000)
    )
    lag = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]["schedule_lag_ms"]
    assert lag["count"] == len(MOONCAKE) and lag["p99"] < 100


def test_timed_trace_reads_seconds_and_16_token_blocks_and_a_text_line_sends_its_text(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 2.0, "input_length": 40, "output_length": 3, "hash_ids": [7, 8]},
        {"timestamp": 1.5, "text": "A sentence sent as it is.", "output_length": 2},
        {"timestamp": 3.0, "input_length": 20, "output_length": 3, "hash_ids": [7]},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scenario = _parse(
        tmp_path, '[workload.dataset]\nkind = "trace"\nformat = "timed_trace"\npath = "t.jsonl"'
    )
    workload = scenario.workload  # type: ignore[attr-defined]
    entries = workload.dataset.entries
    # Sorted by timestamp, due from the first line's.
    assert [e.timestamp_s for e in entries] == [0.0, 0.5, 1.5]
    assert entries[0].prompt == "A sentence sent as it is."
    assert entries[1].prompt[:16] == entries[2].prompt[:16] and len(entries[1].prompt) == 40
    assert send_offsets_s(3, workload.arrivals, seed=99) == [0.0, 0.5, 1.5]  # no seed enters a trace


def test_prefix_repetition_sends_n_prefixes_each_with_its_own_suffixes(tmp_path: Path, paced) -> None:
    server = paced(interval_ms=1.0)
    workload = (
        'num_requests = 6\nconcurrency = 2\n[workload.dataset]\nkind = "prefix_repetition"\n'
        "prefix_len = 24\nsuffix_len = 8\nnum_prefixes = 3\noutput_len = 4"
    )
    result = run(tmp_path, server.url, workload)
    assert result.returncode == 0, result.stderr
    prompts = [row["prompt"] for row in server.stop()["finished"]]
    assert len(prompts) == 6 and all(len(p) == 32 for p in prompts)
    prefixes = {tuple(p[:24]) for p in prompts}
    assert len(prefixes) == 3
    assert all(sum(tuple(p[:24]) == prefix for p in prompts) == 2 for prefix in prefixes)
    assert len({tuple(p[24:]) for p in prompts}) == 6


def test_spec_bench_keeps_the_chosen_categories_and_sends_each_first_turn(tmp_path: Path, paced) -> None:
    _copy_fixtures(tmp_path)
    server = paced(interval_ms=1.0)
    workload = (
        'concurrency = 2\n[workload.dataset]\nkind = "spec_bench"\npath = "spec_bench_question.jsonl"\n'
        'category = ["coding", "qa"]\noutput_len = 5'
    )
    result = run(tmp_path, server.url, workload)
    assert result.returncode == 0, result.stderr
    finished = server.stop()["finished"]
    questions = [json.loads(x) for x in (FIXTURES / "spec_bench_question.jsonl").read_text().splitlines()]
    wanted = sorted(q["turns"][0] for q in questions if q["category"] in ("coding", "qa"))
    assert sorted(row["prompt"] for row in finished) == wanted
    assert {row["max_tokens"] for row in finished} == {5}
    assert sorted(r["category"] for r in lines(tmp_path)) == ["coding", "coding", "qa", "qa"]
    categories = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]["categories"]
    assert set(categories) == {"coding", "qa"}


def test_speed_bench_reads_its_subset_file_from_the_folder(tmp_path: Path) -> None:
    _copy_fixtures(tmp_path)
    scenario = _parse(
        tmp_path,
        '[workload.dataset]\nkind = "speed_bench"\npath = "speed_bench"\ncategory = "math_reasoning"',
    )
    entries = scenario.workload.dataset.entries  # type: ignore[attr-defined]
    assert [(e.category, e.prompt[:9]) for e in entries] == [("math_reasoning", "If a trai")]


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (
            'trace_scale = 0\n[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"',
            "trace_scale` must be",
        ),
        (
            'request_rate = 2\n[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"',
            "brings its own schedule",
        ),
        (
            'warmup_requests = 9\n[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"',
            "the trace's 6 lines",
        ),
        ('prompts = ["a"]\ntrace_scale = 2', 'needs [workload.dataset] kind = "trace"'),
        (
            '[workload.dataset]\nkind = "trace"\nformat = "weka"\npath = "mooncake.jsonl"',
            "format` must be one of",
        ),
        (
            '[workload.dataset]\nkind = "trace"\npath = "spec_bench_question.jsonl"',
            ":1 needs a numeric `timestamp`",
        ),
        (
            'num_requests = 2\n[workload.dataset]\nkind = "prefix_repetition"\nprefix_len = 4\n'
            "suffix_len = 4\nnum_prefixes = 3\noutput_len = 4",
            "every prefix needs a request",
        ),
        (
            'num_requests = 4\n[workload.dataset]\nkind = "prefix_repetition"\nprefix_len = 0\n'
            "suffix_len = 4\nnum_prefixes = 2\noutput_len = 4",
            "prefix_len` must be",
        ),
        (
            '[workload.dataset]\nkind = "spec_bench"\npath = "spec_bench_question.jsonl"\n'
            'category = "poetry"',
            "names poetry, not in",
        ),
        (
            '[workload.dataset]\nkind = "speed_bench"\npath = "speed_bench"\nsubset = "x"',
            "subset` must be one of",
        ),
        ('[workload.dataset]\nkind = "speed_bench"\npath = "mooncake.jsonl"', "which is not a folder"),
    ],
)
def test_bad_workload_input_is_one_line_naming_the_key(tmp_path: Path, workload: str, message: str) -> None:
    _copy_fixtures(tmp_path)
    with pytest.raises(ScenarioError) as caught:
        _parse(tmp_path, workload)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_trace_is_exit_2_with_one_line_from_the_cli(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 4}\n')
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\n[workload]\n[workload.dataset]\nkind = "trace"\npath = "t.jsonl"\n'
        '[[variants]]\nname = "A"\n'
    )
    result = itlaudit(
        "run", str(path), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "run"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "output_length must be an integer" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_vllm_bench_flags_name_the_new_datasets_and_prefix_repetition_needs_its_table(tmp_path: Path) -> None:
    from itlaudit.model.scenario import ScenarioFlags, build_scenario

    flags = ScenarioFlags(
        url="http://127.0.0.1:9",
        dataset_name="spec_bench",
        dataset_path=FIXTURES / "spec_bench_question.jsonl",
    )
    scenario, _ = build_scenario(None, flags)
    assert scenario.workload.dataset is not None and len(scenario.workload.dataset.entries) == 12
    trace = ScenarioFlags(
        url="http://127.0.0.1:9", dataset_name="trace", dataset_path=FIXTURES / "mooncake.jsonl"
    )
    replay = build_scenario(None, trace)[0].workload
    assert replay.arrivals.trace_s is not None and replay.num_requests == 6  # --num-prompts 1000: its end
    with pytest.raises(ScenarioError, match="takes its lengths from a scenario"):
        build_scenario(None, ScenarioFlags(url="http://127.0.0.1:9", dataset_name="prefix_repetition"))
    table = (
        'name = "t"\n[workload]\nnum_requests = 4\n[workload.dataset]\nkind = "prefix_repetition"\n'
        'prefix_len = 8\nsuffix_len = 4\nnum_prefixes = 2\noutput_len = 3\n[[variants]]\nname = "A"\n'
    )
    (tmp_path / "s.toml").write_text(table)
    again = ScenarioFlags(url="http://127.0.0.1:9", dataset_name="prefix_repetition")
    assert len(build_scenario(tmp_path / "s.toml", again)[0].workload.dataset.entries) == 4  # type: ignore[union-attr]
