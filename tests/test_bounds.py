"""Every numeric scenario key and vllm-bench flag is finite and within a stated bound (issue 23): each
bad value is one line naming the key (file:line, or the flag) and the range; the sane value next to it
is taken. The end-to-end CLI cases of the fault campaign are in test_faults_campaign_bounds.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from itlaudit.cli.options import build_capture
from itlaudit.errors import ScenarioError
from itlaudit.model.datasets import MAX_DRAWN_TOKENS
from itlaudit.model.scenario import ScenarioFlags, build_scenario, parse_scenario
from itlaudit.model.scenario_toml import Bound
from itlaudit.model.schedule import Arrivals, RampUp, expected_span_s, send_offsets_s

HEAD = 'name = "b"\n\n[workload]\nprompts = ["Tell me a story about a lighthouse."]\n'
VARIANT = '\n[[variants]]\nname = "v"\nurl = "http://127.0.0.1:9"\n'


def scenario_text(workload: str, extra: str = "") -> str:
    return HEAD + workload + "\n" + extra + VARIANT


def parse(text: str, tmp_path: Path):
    path = tmp_path / "b.toml"
    path.write_text(text)
    return parse_scenario(text, path), path


# (case, the [workload] lines with the bad value, the same with its sane neighbour, what the message names)
WORKLOAD_CASES = [
    (
        "temperature nan",
        "temperature = nan",
        "temperature = 0.7",
        "`workload.temperature` must be a finite number in [0, 100], got nan",
    ),
    ("temperature inf", "temperature = inf", "temperature = 100", "in [0, 100], got inf"),
    ("temperature negative", "temperature = -0.1", "temperature = 0", "in [0, 100], got -0.1"),
    (
        "request_timeout nan",
        "request_timeout_s = nan",
        "request_timeout_s = 30",
        "`workload.request_timeout_s` must be a finite number in (0, 86400] s, got nan",
    ),
    (
        "connect_timeout inf",
        "connect_timeout_s = inf",
        "connect_timeout_s = 86400",
        "`workload.connect_timeout_s` must be a finite number in (0, 86400] s, got inf",
    ),
    (
        "ttft_timeout huge",
        "ttft_timeout_s = 1e9",
        "ttft_timeout_s = 3600",
        "`workload.ttft_timeout_s` must be a finite number in (0, 86400] s",
    ),
    (
        "stall_timeout zero",
        "stall_timeout_s = 0",
        "stall_timeout_s = 0.5",
        "`workload.stall_timeout_s` must be a finite number in (0, 86400] s, got 0",
    ),
    (
        "warmups 1e11",
        "warmup_requests = 100000000000",
        "warmup_requests = 1000000",
        "`workload.warmup_requests` must be an integer in [0, 1000000], got 100000000000",
    ),
    (
        "num_requests",
        "num_requests = 1000001",
        "num_requests = 1000000",
        "`workload.num_requests` must be an integer in [1, 1000000]",
    ),
    (
        "concurrency 0",
        "concurrency = 0",
        "concurrency = 1",
        "`workload.concurrency` must be an integer in [1, 1000000], got 0",
    ),
    (
        "concurrency huge",
        "concurrency = 1000001",
        "concurrency = 1000000",
        "`workload.concurrency` must be an integer in [1, 1000000]",
    ),
    (
        "max_tokens",
        "max_tokens = 10000001",
        "max_tokens = 10000000",
        "`workload.max_tokens` must be an integer in [1, 10000000]",
    ),
    (
        "min_tokens",
        "min_tokens = -1",
        "min_tokens = 0",
        "`workload.min_tokens` must be an integer in [0, 10000000], got -1",
    ),
    (
        "seed negative",
        "seed = -1",
        "seed = 0",
        "`workload.seed` must be an integer in [0, 9223372036854775807], got -1",
    ),
    (
        "stop token id",
        "stop_token_ids = [-1]",
        "stop_token_ids = [0]",
        "`workload.stop_token_ids` must be an integer in [0, 2147483647], got -1",
    ),
    (
        "rate nan",
        "request_rate = nan",
        "request_rate = 4",
        "`workload.request_rate` must be a finite number in (0, 1000000] requests/s, got nan",
    ),
    (
        "rate inf",
        "request_rate = inf",
        "request_rate = 1000000",
        "`workload.request_rate` must be a finite number in (0, 1000000] requests/s, got inf",
    ),
    ("rate zero", "request_rate = 0", "request_rate = 0.001", "in (0, 1000000] requests/s, got 0"),
    (
        "ramp nan",
        "ramp_up = { start_rate = nan, end_rate = 8 }",
        "ramp_up = { start_rate = 1, end_rate = 8 }",
        "`workload.start_rate` must be a finite number in (0, 1000000] requests/s, got nan",
    ),
    (
        "burstiness tiny",
        "request_rate = 4\nburstiness = 1e-9",
        "request_rate = 4\nburstiness = 0.01",
        "`workload.burstiness` must be a finite number in [0.01, 1000], got 1e-09",
    ),
    (
        "burstiness huge",
        "request_rate = 4\nburstiness = 1e9",
        "request_rate = 4\nburstiness = inf",
        "`workload.burstiness` must be a finite number in [0.01, 1000], got 1000000000.0",
    ),
    (
        "burstiness nan",
        "request_rate = 4\nburstiness = nan",
        "request_rate = 4\nburstiness = 1000",
        "got nan",
    ),
    (
        "duration",
        "request_rate = 4\nduration_s = 86401",
        "request_rate = 4\nduration_s = 86400",
        "`workload.duration_s` must be a finite number in (0, 86400] s, got 86401",
    ),
    (
        "extra_body top_p",
        "extra_body = { top_p = 0 }",
        "extra_body = { top_p = 1 }",
        "`workload.extra_body` sets top_p: must be a finite number in (0, 1], got 0",
    ),
    (
        "extra_body top_k",
        "extra_body = { top_k = -2 }",
        "extra_body = { top_k = -1 }",
        "sets top_k: must be an integer in [-1, 10000000], got -2",
    ),
    (
        "extra_body temperature",
        "extra_body = { temperature = nan }",
        "extra_body = { temperature = 1.5 }",
        "sets temperature: must be a finite number in [0, 100], got nan",
    ),
    (
        "extra_body any inf",
        "extra_body = { my_knob = inf }",
        "extra_body = { my_knob = 1e300 }",
        "sets my_knob: must be a finite number, got inf",
    ),
    (
        "extra_body nested nan",
        "extra_body = { logit_bias = { 5 = nan } }",
        "extra_body = { logit_bias = { 5 = -100 } }",
        "holds a nan or inf under 'logit_bias'",
    ),
    # A schedule that would send nothing within duration_s, or take more than a day: the span is named.
    (
        "rate past duration",
        "request_rate = 0.01\nduration_s = 60",
        "request_rate = 0.02\nduration_s = 60",
        "sends its first request after ~100 s, past duration_s (60 s)",
    ),
    (
        "rate 1e-9",
        "request_rate = 1e-9\nnum_requests = 2",
        "request_rate = 2.4e-5\nnum_requests = 2",
        "spreads 2 requests over ~2e+09 s, more than a day (86400 s)",
    ),
    (
        "ramp over a day",
        "ramp_up = { start_rate = 1e-6, end_rate = 1e-6 }\nnum_requests = 2",
        "ramp_up = { start_rate = 1e-4, end_rate = 1e-4 }\nnum_requests = 2",
        "`workload.ramp_up` at 1e-06 requests/s spreads 2 requests over ~2e+06 s",
    ),
    (
        "warmups over a day",
        "request_rate = 1\nwarmup_requests = 86400\nnum_requests = 1",
        "request_rate = 1\nwarmup_requests = 86399\nnum_requests = 1",
        "spreads 86401 requests over ~8.64e+04 s",
    ),
    (
        "warmups over a day beside a duration",  # duration_s bounds the measured phase, not the warmup
        "request_rate = 1\nwarmup_requests = 86400\nduration_s = 60",
        "request_rate = 1\nwarmup_requests = 86000\nduration_s = 60",
        "spreads 86460 requests over ~8.65e+04 s, more than a day",
    ),
]


@pytest.mark.parametrize(
    ("bad", "good", "fragment"), [c[1:] for c in WORKLOAD_CASES], ids=[c[0] for c in WORKLOAD_CASES]
)
def test_a_workload_key_out_of_bounds_is_one_line_with_the_bound(
    bad: str, good: str, fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(ScenarioError) as raised:
        parse(scenario_text(bad), tmp_path)
    message = str(raised.value)
    assert fragment in message
    assert message.startswith(f"{tmp_path / 'b.toml'}:"), message  # file:line, as every other check
    assert "\n" not in message and raised.value.exit_code == 2
    parse(scenario_text(good), tmp_path)  # the sane neighbour is taken


DATASET = '[workload.dataset]\nkind = "random"\n'
DATASET_CASES = [
    (
        "input_len 1e9",
        "input_len = 1000000000\noutput_len = 8",
        "input_len = 64\noutput_len = 8",
        "`workload.dataset.input_len` must be an integer in [1, 10000000], got 1000000000",
    ),
    (
        "output_len",
        "input_len = 8\noutput_len = 10000001",
        "input_len = 8\noutput_len = 10000000",
        "`workload.dataset.output_len` must be an integer in [1, 10000000]",
    ),
    (
        "range max",
        "input_len = { min = 1, max = 20000000 }\noutput_len = 8",
        "input_len = { min = 1, max = 64 }\noutput_len = 8",
        "max must be an integer in [1, 10000000], got 20000000",
    ),
    (
        "mean nan",
        "input_len = { mean = nan, std = 1 }\noutput_len = 8",
        "input_len = { mean = 32, std = 1 }\noutput_len = 8",
        "got {'mean': nan, 'std': 1}",
    ),
    (
        "std inf",
        "input_len = { mean = 32, std = inf }\noutput_len = 8",
        "input_len = { mean = 32, std = 8 }\noutput_len = 8",
        "std must be a finite number in [0, 10000000], got inf",
    ),
    (
        "vocab",
        "input_len = 8\noutput_len = 8\nvocab_size = 2147483648",
        "input_len = 8\noutput_len = 8\nvocab_size = 2147483647",
        "`workload.dataset.vocab_size` must be an integer in [5, 2147483647]",
    ),
    (
        "drawn total",
        "input_len = 10000000\noutput_len = 8",
        "input_len = 100000\noutput_len = 8",
        f"draws 60000000 prompt tokens over 6 requests, above the {MAX_DRAWN_TOKENS}",
    ),
]


@pytest.mark.parametrize(
    ("bad", "good", "fragment"), [c[1:] for c in DATASET_CASES], ids=[c[0] for c in DATASET_CASES]
)
def test_a_random_dataset_length_out_of_bounds_is_one_line(
    bad: str, good: str, fragment: str, tmp_path: Path
) -> None:
    text = HEAD.replace('prompts = ["Tell me a story about a lighthouse."]\n', "num_requests = 6\n")
    with pytest.raises(ScenarioError) as raised:
        parse(text + DATASET + bad + "\n" + VARIANT, tmp_path)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'b.toml'}:")
    parse(text + DATASET + good + "\n" + VARIANT, tmp_path)


def test_goodput_and_launch_numbers_are_bounded_too(tmp_path: Path) -> None:
    with pytest.raises(
        ScenarioError, match=r"`goodput.tpot_ms` must be a finite number in \(0, 1000000000000000\] ms"
    ):
        parse(scenario_text("", "[goodput]\ntpot_ms = nan\n"), tmp_path)
    launch = '\n[[variants]]\nname = "w"\n[variants.launch]\nkind = "command"\ncommand = ["x"]\n'
    with pytest.raises(ScenarioError, match=r"`variants.launch.ready_timeout_s` must be a finite number"):
        parse(scenario_text("") + launch + "ready_timeout_s = inf\n", tmp_path)
    parse(scenario_text("") + launch + "ready_timeout_s = 600\n", tmp_path)


# The vllm-bench-named flags go through ScenarioFlags into the same parser: the same bounds, the flag named.
FLAG_CASES = [
    (
        "temperature",
        {"temperature": math.nan},
        {"temperature": 0.0},
        "--temperature: `workload.temperature` must be a finite number in [0, 100], got nan",
    ),
    (
        "request_rate nan",
        {"request_rate": math.nan},
        {"request_rate": math.inf},
        "--request-rate: `workload.request_rate` must be a finite number in (0, 1000000]",
    ),
    (
        "request_rate 1e-9",
        {"request_rate": 1e-9, "num_prompts": 10},
        {"request_rate": 1.0, "num_prompts": 10},
        "spreads 10 requests over ~1e+10 s, more than a day",
    ),
    (
        "burstiness",
        {"request_rate": 4.0, "burstiness": 1e-9},
        {"request_rate": 4.0, "burstiness": 0.5},
        "--burstiness: `workload.burstiness` must be a finite number in [0.01, 1000]",
    ),
    (
        "num_warmups",
        {"num_warmups": 10**11},
        {"num_warmups": 10},
        "--num-warmups: `workload.warmup_requests` must be an integer in [0, 1000000]",
    ),
    (
        "random_input_len",
        {"random_input_len": 10**9, "num_prompts": 1},
        {"random_input_len": 64, "num_prompts": 1},
        "--random-input-len: `workload.dataset.input_len` must be an integer in [1, 10000000]",
    ),
    (
        "max_tokens",
        {"max_tokens": 10**8},
        {"max_tokens": 8},  # a random request's max_tokens is its output length: the same, or refused
        "--max-tokens: `workload.max_tokens` must be an integer in [1, 10000000]",
    ),
    ("seed", {"seed": -3}, {"seed": 3}, "--seed: `workload.seed` must be an integer in [0,"),
    (
        "num_prompts",
        {"num_prompts": 10**7},
        {"num_prompts": 10},
        "--num-prompts: `workload.num_requests` must be an integer in [1, 1000000]",
    ),
    (
        "max_concurrency",
        {"max_concurrency": 10**7, "num_prompts": 10},
        {"max_concurrency": 4, "num_prompts": 10},
        "--max-concurrency: `workload.concurrency` must be an integer in [1, 1000000]",
    ),
]


@pytest.mark.parametrize(
    ("bad", "good", "fragment"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES]
)
def test_a_bench_flag_out_of_bounds_names_the_flag_and_the_bound(
    bad: dict[str, float], good: dict[str, float], fragment: str, tmp_path: Path
) -> None:
    common = {
        "url": "http://127.0.0.1:9",
        "random_input_len": 8,
        "random_output_len": 8,
        "dataset_name": "random",
    }
    flags = {**common, "num_prompts": 4, **bad}
    with pytest.raises(ScenarioError) as raised:
        build_scenario(None, ScenarioFlags(**flags))  # type: ignore[arg-type]
    assert fragment in str(raised.value) and "\n" not in str(raised.value)
    build_scenario(None, ScenarioFlags(**{**common, "num_prompts": 4, **good}))  # type: ignore[arg-type]


def test_a_flag_over_a_file_key_is_named_as_the_flag_not_the_files_line(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text(scenario_text("temperature = 0"))
    with pytest.raises(ScenarioError, match=r"^--temperature: `workload.temperature` .* got inf$"):
        build_scenario(path, ScenarioFlags(temperature=math.inf))
    scenario, _ = build_scenario(path, ScenarioFlags(temperature=1.0))
    assert scenario.workload.params.temperature == 1.0


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, 86401.0])
def test_a_timeout_flag_out_of_bounds_is_one_line(value: float) -> None:
    with pytest.raises(
        ScenarioError, match=r"^--request-timeout .*: must be a finite number in \(0, 86400\] s"
    ):
        build_capture(timeouts={"request_timeout_s": value})
    assert build_capture(timeouts={"request_timeout_s": 86400.0}).timeouts == {"request_timeout_s": 86400.0}


def test_the_bound_helper_refuses_nan_and_inf_and_keeps_its_ends() -> None:
    bound = Bound(0, 10, open_low=True, unit="s")
    assert str(bound) == "(0, 10] s"
    assert [bound.holds(v) for v in (math.nan, math.inf, -math.inf, 0, 1e-12, 10, 10.0001)] == [
        False,
        False,
        False,
        False,
        True,
        True,
        False,
    ]
    assert Bound(1, 5, integer=True).problem(6) == "must be an integer in [1, 5], got 6"


@pytest.mark.parametrize(
    "arrivals",
    [Arrivals(request_rate=3.0), Arrivals(ramp_up=RampUp(1.0, 9.0)), Arrivals(ramp_up=RampUp(5.0, 5.0))],
    ids=["rate", "ramp", "flat ramp"],
)
def test_the_expected_span_is_what_the_schedule_draws_on_average(arrivals: Arrivals) -> None:
    """The span a scenario is refused on is the schedule's own: its mean over many seeds."""
    count = 400
    drawn = sum(send_offsets_s(count, arrivals, seed)[-1] for seed in range(40)) / 40
    assert drawn == pytest.approx(expected_span_s(count, arrivals), rel=0.03)
