"""Scenario loading: valid files load with the right values; every bad key is named with its line."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import (
    Scenario,
    ScenarioFlags,
    build_scenario,
    load_scenario,
    parse_scenario,
    scenario_toml,
)

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
name = "k0-vs-k3"
endpoint = "chat"
model = "tiny"

[workload]
prompts = ["hello", "world"]
num_requests = 5
concurrency = 2
max_tokens = 64
min_tokens = 64
ignore_eos = true
temperature = 0
stop_token_ids = [7, 9]
seed = 3

[[variants]]
name = "K0"
url = "http://127.0.0.1:8000/"

[[variants]]
name = "K3"
[variants.launch]
kind = "python"
python = "/opt/venv/bin/python"
model = "/models/tiny"
server_args = ["--enforce-eager"]
env = { VLLM_CPU_KVCACHE_SPACE = "1" }
"""


def parse(text: str) -> object:
    return parse_scenario(text, Path("s.toml"))


def test_good_scenario_values() -> None:
    sc = parse_scenario(GOOD, Path("s.toml"))
    assert sc.name == "k0-vs-k3"
    assert sc.endpoint == "chat"
    assert sc.workload.num_requests == 5
    assert sc.workload.concurrency == 2
    p = sc.workload.params
    assert (p.max_tokens, p.min_tokens, p.ignore_eos, p.temperature, p.seed) == (64, 64, True, 0.0, 3)
    assert p.stop_token_ids == [7, 9]
    assert sc.variants[0].url == "http://127.0.0.1:8000"
    launch = sc.variants[1].launch
    assert launch is not None and launch.kind == "python" and launch.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert [sc.prompt_for(i) for i in range(3)] == ["hello", "world", "hello"]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("max_tokens = 64", 'max_tokens = "64"', "s.toml:9: `workload.max_tokens` must be int, got str '64'"),
        ("concurrency = 2", "concurrency = 0", "s.toml:8: `workload.concurrency` must be an integer in [1,"),
        ("ignore_eos = true", "ignore_eos = 1", "s.toml:11: `workload.ignore_eos` must be bool"),
        ("seed = 3", "sede = 3", "s.toml:14: `workload.sede` is not a known key"),
        ('endpoint = "chat"', 'endpoint = "embed"', "s.toml:2: `endpoint` must be one of completions, chat"),
        ("min_tokens = 64", "min_tokens = 65", "`workload.min_tokens` (65) is larger than max_tokens (64)"),
        ('kind = "python"', 'kind = "k8s"', "`variants.launch.kind` must be one of python, sglang, docker"),
        ('kind = "python"', 'kind = "url"', "attaches to a running server: give the variant a `url` instead"),
        (
            'url = "http://127.0.0.1:8000/"',
            'url = "127.0.0.1:8000"',
            "`variants.url` must start with http://",
        ),
        (
            "stop_token_ids = [7, 9]",
            'stop_token_ids = ["7"]',
            "`workload.stop_token_ids` must be a list of int",
        ),
        (
            'python = "/opt/venv/bin/python"\n',
            "",
            "`variants.launch.python` is missing; kind 'python' needs it",
        ),
    ],
)
def test_bad_keys_are_named_with_line(old: str, new: str, expected: str) -> None:
    assert old in GOOD
    with pytest.raises(ScenarioError) as info:
        parse(GOOD.replace(old, new))
    assert expected in str(info.value)


def test_toml_syntax_error_names_line() -> None:
    with pytest.raises(ScenarioError, match=r"s.toml: not valid TOML: .*line 2"):
        parse('name = "x"\nendpoint = \n')


def test_missing_file_and_missing_name() -> None:
    with pytest.raises(ScenarioError, match="scenario file not found"):
        load_scenario(Path("/nonexistent/x.toml"))
    with pytest.raises(ScenarioError, match="`name` is missing"):
        parse(GOOD.replace('name = "k0-vs-k3"\n', ""))


def test_duplicate_variant_names() -> None:
    text = GOOD.replace('name = "K3"', 'name = "K0"')
    with pytest.raises(ScenarioError, match="'K0' is used twice"):
        parse(text)


def test_prompts_file_split_on_separator(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("first\nline two\n---\nsecond\n", encoding="utf-8")
    text = GOOD.replace('prompts = ["hello", "world"]', 'prompts_file = "p.txt"')
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    assert load_scenario(path).workload.prompts == ["first\nline two", "second"]
    (tmp_path / "p.txt").unlink()
    with pytest.raises(ScenarioError, match=r"prompts_file` names .*p\.txt, which does not exist"):
        load_scenario(path)


SHIPPED = sorted(p for p in (REPO / "scenarios").rglob("*.toml") if p.name != "suite.toml")  # suites: smoke's


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO / "scenarios")))
def test_shipped_scenarios_load(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.variants and sc.workload.prompts


def test_workload_timeouts_default_and_override() -> None:
    defaults = parse(GOOD).workload.timeouts  # type: ignore[attr-defined]
    assert (defaults.connect_timeout_s, defaults.ttft_timeout_s) == (30.0, None)
    assert (defaults.stall_timeout_s, defaults.request_timeout_s) == (60.0, None)
    text = GOOD.replace(
        "seed = 3", "seed = 3\nstall_timeout_s = 5\nrequest_timeout_s = 120\nttft_timeout_s = 300"
    )
    timeouts = parse(text).workload.timeouts  # type: ignore[attr-defined]
    assert (timeouts.stall_timeout_s, timeouts.request_timeout_s, timeouts.ttft_timeout_s) == (
        5.0,
        120.0,
        300.0,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("stall_timeout_s = 0", "`workload.stall_timeout_s` must be a finite number in (0, 86400] s"),
        ('request_timeout_s = "1h"', "`workload.request_timeout_s` must be int or float"),
        ("extra_body = { n = 2 }", "sets n = 2; itlaudit records one choice per request"),
        ("extra_body = { best_of = 3 }", "sets best_of = 3"),
    ],
)
def test_bad_timeouts_and_several_choices_are_refused(line: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=r"s\.toml:") as caught:
        parse(GOOD.replace("seed = 3", f"seed = 3\n{line}"))
    assert message in str(caught.value)


def test_n_of_1_is_accepted() -> None:
    assert parse(GOOD.replace("seed = 3", "seed = 3\nextra_body = { n = 1 }"))


def _same(a: Scenario, b: Scenario) -> None:
    """Equal as experiments: everything but the file they came from."""
    assert dataclasses.replace(a, path=None) == dataclasses.replace(b, path=None)


@pytest.mark.parametrize(
    "flags",
    [
        ScenarioFlags(url="http://127.0.0.1:8000"),
        ScenarioFlags(
            variant_urls={"K0": "http://a:1", "K3": "http://b:2"},
            dataset_name="random",
            random_input_len=64,
            random_output_len=32,
            num_prompts=7,
            request_rate=2.5,
            burstiness=0.5,
            num_warmups=2,
            seed=11,
            endpoint="completions",
            model="m",
        ),
        ScenarioFlags(
            url="http://x:1",
            dataset_name="jsonl",
            dataset_path=REPO / "scenarios" / "prompts" / "specbench-like.jsonl",
            max_tokens=9,
            ignore_eos=True,
            temperature=0.0,
            max_concurrency=3,
        ),
    ],
    ids=["bench-defaults", "random-open-loop", "jsonl"],
)
def test_saved_scenario_loads_back_to_the_same_scenario(tmp_path: Path, flags: ScenarioFlags) -> None:
    scenario, raw = build_scenario(None, flags)
    target = tmp_path / "elsewhere" / "saved.toml"
    target.parent.mkdir()
    target.write_text(scenario_toml(raw, Path.cwd(), target, ["a header"]), encoding="utf-8")
    _same(load_scenario(target), scenario)
    assert target.read_text().startswith("# a header\n")
    assert "num_requests = " in target.read_text() and "# --num-prompts" in target.read_text()


def test_flags_only_takes_vllm_bench_serves_defaults() -> None:
    scenario, _ = build_scenario(None, ScenarioFlags(url="http://h:1", num_prompts=10))
    dataset = scenario.workload.dataset
    assert dataset is not None and dataset.kind == "random"
    assert {(len(e.prompt or []), e.max_tokens) for e in dataset.entries} == {(1024, 128)}
    # no --max-concurrency and no --request-rate: every request at once, as vllm bench serve sends them
    assert (scenario.workload.num_requests, scenario.workload.concurrency) == (10, 10)
    assert [(v.name, v.url) for v in scenario.variants] == [("server", "http://h:1")]


def test_max_tokens_is_a_random_requests_length_or_refused_never_ignored(tmp_path: Path) -> None:
    """A random request's max_tokens is its output length: `--max-tokens 40` on the default random
    dataset makes 40-token requests (it was silently 128), a different --random-output-len beside it
    is one line, and a dataset whose requests carry their own lengths refuses it in one line."""
    scenario, _ = build_scenario(None, ScenarioFlags(url="http://h:1", num_prompts=2, max_tokens=40))
    dataset = scenario.workload.dataset
    assert dataset is not None and {e.max_tokens for e in dataset.entries} == {40}
    same = ScenarioFlags(url="http://h:1", num_prompts=2, max_tokens=40, random_output_len=40)
    assert build_scenario(None, same)[0].workload.dataset is not None
    with pytest.raises(ScenarioError, match="--max-tokens 40 and --random-output-len 64 disagree"):
        build_scenario(None, ScenarioFlags(url="http://h:1", max_tokens=40, random_output_len=64))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [1]}\n')
    with pytest.raises(ScenarioError, match="--max-tokens does not reach a trace dataset's requests"):
        build_scenario(
            None, ScenarioFlags(url="http://h:1", dataset_name="trace", dataset_path=trace, max_tokens=9)
        )


def test_flags_replace_the_files_keys_and_the_copy_still_finds_its_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scenario copied with its prompts folder reads them from beside itself, whatever the working
    directory; flags replace the keys they name; saved elsewhere, the prompts path still names them."""
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "scenarios" / "prompts", copy / "prompts")
    shutil.copy(REPO / "scenarios" / "mtp-long-decode.toml", copy / "mine.toml")
    monkeypatch.chdir(tmp_path.parent)
    original = load_scenario(copy / "mine.toml")
    assert original.workload.prompts[0].startswith(
        (REPO / "scenarios/prompts/long-design-doc.txt").read_text()[:40]
    )
    scenario, raw = build_scenario(
        copy / "mine.toml", ScenarioFlags(num_prompts=2, max_tokens=64, variant_urls={"K3": "http://c:3"})
    )
    assert (scenario.workload.num_requests, scenario.workload.params.max_tokens) == (2, 64)
    assert scenario.workload.params.min_tokens == 64  # forced length (min = max) stays forced
    assert scenario.workload.params.ignore_eos  # not named by a flag: the file's value
    assert scenario.workload.prompts == original.workload.prompts
    for target in (copy / "again.toml", tmp_path / "away" / "again.toml"):
        target.parent.mkdir(exist_ok=True)
        target.write_text(scenario_toml(raw, copy, target, []), encoding="utf-8")
        saved = load_scenario(target)
        assert saved.workload == scenario.workload
        assert [(v.name, v.url) for v in saved.variants] == [
            ("K0", "http://127.0.0.1:8000"),
            ("K3", "http://c:3"),
        ]
    assert 'prompts_file = "prompts/long-design-doc.txt"' in (copy / "again.toml").read_text()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ScenarioFlags(url="http://h:1", dataset_name="sharegpt"),
            "--dataset-name sharegpt needs --dataset-path",
        ),
        (
            ScenarioFlags(url="http://h:1", dataset_name="jsonl", random_input_len=3),
            "--random-input-len is for",
        ),
        (ScenarioFlags(variant_urls={"K9": "http://h:1"}), None),
    ],
)
def test_flag_combinations_that_cannot_be_run_are_named(flags: ScenarioFlags, needle: str | None) -> None:
    if needle is None:  # a flags-only run's variants are the flags' own
        assert [v.name for v in build_scenario(None, flags)[0].variants] == ["K9"]
        with pytest.raises(ScenarioError, match="--variant names K9, not in the scenario"):
            build_scenario(REPO / "scenarios" / "mtp-long-decode.toml", flags)
        return
    with pytest.raises(ScenarioError, match=needle):
        build_scenario(None, flags)


def test_max_tokens_flag_below_a_scenarios_floor_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(GOOD.replace("min_tokens = 64", "min_tokens = 10"), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"--max-tokens 5 is below the scenario's min_tokens \(10\)"):
        build_scenario(path, ScenarioFlags(max_tokens=5))
    assert build_scenario(path, ScenarioFlags(max_tokens=20))[0].workload.params.min_tokens == 10


def test_vllm_bench_flags_make_the_same_workload_as_the_shipped_scenario() -> None:
    """scenarios/vllm-bench-random.toml's comment says its vllm bench serve command and the flags-only
    run are the same experiment: they build the same workload."""
    flags = ScenarioFlags(
        url="http://127.0.0.1:8000",
        dataset_name="random",
        random_input_len=1024,
        random_output_len=128,
        num_prompts=200,
        request_rate=4.0,
        burstiness=1.0,
        max_concurrency=16,
    )
    from_flags, _ = build_scenario(None, flags)
    assert from_flags.workload == load_scenario(REPO / "scenarios" / "vllm-bench-random.toml").workload


def test_only_picks_and_orders_the_variants_and_names_an_unknown_one() -> None:
    """`--only NAME` (run, compare, sweep, bisect, track nightly): these variants, in this order."""
    path = REPO / "scenarios" / "mtp-long-decode.toml"
    scenario, raw = build_scenario(path, ScenarioFlags(only=["K3", "K0"]))
    assert [v.name for v in scenario.variants] == ["K3", "K0"]
    assert [v["name"] for v in raw["variants"]] == ["K3", "K0"]  # --save-scenario writes what runs
    assert [v.name for v in build_scenario(path, ScenarioFlags(only=["K3"]))[0].variants] == ["K3"]
    with pytest.raises(ScenarioError, match=r"--only 'K9' is not in the scenario \(K0, K3\)"):
        build_scenario(path, ScenarioFlags(only=["K9"]))


def test_random_range_ratio_draws_lengths_as_vllm_bench_does() -> None:
    """--random-range-ratio R: each random length L is drawn uniformly from [floor(L(1−R)), ceil(L(1+R))],
    or per side from vllm bench's {"input": R, "output": R}; R outside [0, 1) is one line."""

    def lengths(ratio: str) -> tuple[set[int], set[int | None]]:
        flags = ScenarioFlags(
            url="http://h:1",
            num_prompts=200,
            random_input_len=100,
            random_output_len=20,
            random_range_ratio=ratio,
        )
        dataset = build_scenario(None, flags)[0].workload.dataset
        assert dataset is not None
        return {len(e.prompt or []) for e in dataset.entries}, {e.max_tokens for e in dataset.entries}

    inputs, outputs = lengths("0.5")
    assert min(inputs) >= 50 and max(inputs) <= 150 and len(inputs) > 20
    assert min(o or 0 for o in outputs) >= 10 and max(o or 0 for o in outputs) <= 30
    inputs, outputs = lengths('{"input": 0.1, "output": 0}')
    assert (
        min(inputs) >= 90 and max(inputs) <= 111 and outputs == {20}
    )  # ceil(100 × 1.1) is 111 in floats, in vLLM too
    with pytest.raises(ScenarioError, match=r"--random-range-ratio '1.5': each ratio must be in \[0, 1\)"):
        lengths("1.5")


K0_K3 = REPO / "tests" / "fixtures" / "bisect" / "probe-k0-k3.toml"
SPEC_ARGS = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":3}']


def test_a_launch_table_without_kind_is_server_arguments_that_run_refuses_in_one_line(
    tmp_path: Path,
) -> None:
    """probe-k0-k3.toml's [variants.launch] tables have no `kind`: server arguments for a server
    bisect's provider supplies (tests/test_bisect_e2e.py bisects it). run, compare and sweep have no
    provider: each stops on it with one line naming the fix, before any server or folder; a server
    given by flag (or --only leaving the variant out) makes the table moot. CI cost: ~0.2 s (parsing
    only, the commands in-process; ~1 s when it is the first test to import the CLI)."""
    from simkit import itlaudit

    k3 = load_scenario(K0_K3, provided=True).variants[1].launch
    assert k3 is not None and k3.server_args == SPEC_ARGS and k3.ready_timeout_s == 30
    line = (
        f"itlaudit: error: {K0_K3}:19: `variants.launch` has no `kind`: server arguments alone are for "
        "bisect and track nightly, whose --provider starts the server; to start it here give kind and "
        'its key (kind = "python" with python, "docker" with image, "command" with command), or give '
        "variant 'K0' a `url`"
    )
    for command in (["run"], ["compare"], ["sweep", "--rate", "1"]):
        done = itlaudit(*command, str(K0_K3), "--out", str(tmp_path / command[0]))
        assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", [line]), command
    assert not list(tmp_path.iterdir())
    by_url, _ = build_scenario(K0_K3, ScenarioFlags(url="http://127.0.0.1:9"))
    only, _ = build_scenario(K0_K3, ScenarioFlags(only=["K3"], variant_urls={"K3": "http://127.0.0.1:9"}))
    assert [v.launch for v in [*by_url.variants, *only.variants]] == [None, None, None]
    with pytest.raises(ScenarioError) as info:
        parse(GOOD.replace('kind = "python"\n', ""))
    assert "`variants.launch.kind` is missing; `python` needs kind = 'python'" in str(info.value)
