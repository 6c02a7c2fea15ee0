"""Pure sweep figures: option parsing, SLA bisection, crossover sentences, goodput, trial pooling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from itlaudit.analysis.sweep import (
    crossover,
    goodput,
    parse_points,
    parse_sla,
    pool_trials,
    sla_search,
)
from itlaudit.errors import ScenarioError, SweepError
from itlaudit.model.block import parse_goodput
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.vocabulary import LoadAxis


def _point(load: float, itl: float, tpot: float | None = None, ttft: float = 10.0) -> dict[str, Any]:
    figures = {p: itl for p in ("p50", "p90", "p99")}
    return {
        LoadAxis.CONCURRENCY: load,
        "itl_ms": figures,
        "tpot_ms": {p: tpot if tpot is not None else itl for p in ("p50", "p90", "p99")},
        "ttft_ms": {p: ttft for p in ("p50", "p90", "p99")},
    }


def test_points_parse_sorted_and_bad_ones_are_named() -> None:
    assert parse_points("4,1,2", LoadAxis.CONCURRENCY) == [1, 2, 4]
    for bad, needle in (("1,x", "'x' is not a number"), ("0,2", "an integer in .1,"), ("2,2", "twice")):
        with pytest.raises(SweepError, match=needle):
            parse_points(bad, LoadAxis.CONCURRENCY)
    for bad in ("nan", "inf", "1e9"):  # a rate point has the request_rate key's bound
        with pytest.raises(SweepError, match=r"must be a finite number in \(0, 1000000\] requests/s"):
            parse_points(f"1,{bad}", "rate")
    with pytest.raises(SweepError, match="is not a number"):
        parse_points("1.5", LoadAxis.CONCURRENCY)


def test_sla_and_goodput_parse_and_refuse_unknown_figures() -> None:
    terms = parse_sla("tpot_p99_ms<=20, ttft_p90_ms<500")
    assert [str(t) for t in terms] == ["tpot_p99_ms<=20", "ttft_p90_ms<500"]
    assert terms[1].met(499.9) and not terms[1].met(500) and terms[0].met(20)
    with pytest.raises(SweepError, match="cannot read 'speed_p99_ms<=3'"):
        parse_sla("speed_p99_ms<=3")
    assert parse_goodput("ttft_ms=500,tpot_ms=20") == {"ttft_ms": 500.0, "tpot_ms": 20.0}
    # vllm bench's spelling (--goodput ttft:500 tpot:20 e2el:4000) is the same SLO
    assert parse_goodput("ttft:500 tpot:20 e2el:4000") == {
        "ttft_ms": 500.0,
        "tpot_ms": 20.0,
        "e2e_ms": 4000.0,
    }
    for bad in ("itl_ms=3", "tpot:0", "tpot:inf", "tpot"):
        with pytest.raises(ScenarioError, match=f"cannot read '{bad}'"):
            parse_goodput(bad)


def _linear_tpot(load: float) -> dict[str, Any]:
    return _point(load, itl=2.0 * load)


def test_sla_bisection_finds_the_integer_limit_of_a_linear_tpot() -> None:
    """TPOT = 2 ms × concurrency, SLA 21 ms: the answer is 10, found by probing between 4 and 16."""
    sla = parse_sla("tpot_p99_ms<=21")
    grid = [1.0, 4.0, 16.0]
    points = {v: _linear_tpot(v) for v in grid}
    probes = []
    while (state := sla_search(points, grid, sla, 1.0)).probe is not None:
        probes.append(state.probe)
        points[state.probe] = _linear_tpot(state.probe)
    assert (state.limit, state.failed_at, state.above_range) == (10.0, 11.0, False)
    assert probes == [10.0, 13.0, 11.0]


def test_sla_met_everywhere_or_nowhere() -> None:
    sla = parse_sla("tpot_p99_ms<=100")
    points = {v: _linear_tpot(v) for v in (1.0, 2.0)}
    assert sla_search(points, [1.0, 2.0], sla, 1.0).above_range
    none = sla_search(points, [1.0, 2.0], parse_sla("tpot_p99_ms<=1"), 1.0)
    assert (none.limit, none.failed_at, none.probe) == (None, 1.0, None)
    assert sla_search({}, [1.0, 2.0], sla, 1.0).probe == 1.0  # nothing measured: measure the grid first


def test_crossover_named_at_the_first_load_where_the_baseline_wins() -> None:
    series = {
        "K0": [_point(c, 10.0) for c in (1, 4, 16, 32)],
        "K3": [_point(1, 4.0), _point(4, 6.0), _point(16, 9.0), _point(32, 12.0)],
    }
    found = crossover(LoadAxis.CONCURRENCY, "K0", "K3", series)
    assert (found.last_faster, found.first_slower) == (16, 32)
    assert found.headline == "K3 is faster per token up to concurrency 16 (1.11×); at 32, K0 is 1.20× faster."


def test_no_crossover_in_range_either_way() -> None:
    faster = {"K0": [_point(c, 10.0) for c in (1, 4)], "K3": [_point(1, 4.0), _point(4, 5.0)]}
    assert "no crossover in range" in crossover(LoadAxis.CONCURRENCY, "K0", "K3", faster).headline
    assert crossover(LoadAxis.CONCURRENCY, "K0", "K3", faster).first_slower is None
    slower = {"K0": [_point(c, 1.0) for c in (1, 4)], "K3": [_point(1, 4.0), _point(4, 5.0)]}
    words = crossover(LoadAxis.CONCURRENCY, "K0", "K3", slower).headline
    assert "not faster per token than K0 at any concurrency" in words and "no crossover in range" in words


def test_goodput_token_tpot_beside_chunk_tpot() -> None:
    """Under K3 chunk ITL is ~4× TPOT: a tool taking it for TPOT fails requests that met the SLO."""
    requests = [
        {"status": "ok", "ttft_ms": 50.0, "tpot_ms": 5.0, "chunk_itl_ms": 20.0, "e2e_ms": 900.0},
        {"status": "ok", "ttft_ms": 50.0, "tpot_ms": 5.0, "chunk_itl_ms": 9.0, "e2e_ms": 900.0},
        {"status": "ok", "ttft_ms": 900.0, "tpot_ms": 5.0, "chunk_itl_ms": 5.0, "e2e_ms": 1500.0},
        {"status": "error", "ttft_ms": 50.0, "tpot_ms": 5.0, "chunk_itl_ms": 5.0, "e2e_ms": 100.0},
    ]
    slo = {"ttft_ms": 500.0, "tpot_ms": 10.0}
    assert goodput(requests, slo, 2.0, "tpot_ms") == 1.0
    assert goodput(requests, slo, 2.0, "chunk_itl_ms") == 0.5
    assert goodput(requests, {}, 2.0, "tpot_ms") is None


def test_trials_pool_to_medians_with_their_spread() -> None:
    def trial(itl: float, rate: float) -> dict[str, Any]:
        base = {"requests": 4, "errors": 0, "findings": 1, "duration_s": 1.0, "acceptance_length": 4.0}
        base.update({"output_tokens_per_s": rate, "requests_per_s": 4.0, "goodput_rps": None})
        base["goodput_chunk_rps"] = None
        for name in ("itl_ms", "chunk_itl_ms", "ttft_ms", "tpot_ms", "e2e_ms"):
            base[name] = {"p50": itl, "p90": itl, "p99": itl}
        return base

    point = pool_trials(LoadAxis.CONCURRENCY, 4, [trial(1.0, 100.0), trial(3.0, 90.0), trial(2.0, 80.0)])
    assert point["itl_ms"]["p50"] == 2.0 and point["output_tokens_per_s"] == 90.0
    assert point["spread"]["itl_ms.p50"] == [1.0, 3.0] and point["requests"] == 12 and point["findings"] == 3
    assert "spread" not in pool_trials(LoadAxis.CONCURRENCY, 4, [trial(1.0, 1.0)])


BASE = """name = "s"
[workload]
prompts = ["hi"]
max_tokens = 8
[[variants]]
name = "K0"
url = "http://127.0.0.1:9"
"""


def test_goodput_table_in_the_scenario() -> None:
    scenario = parse_scenario(BASE + "[goodput]\ntpot_ms = 20\nttft_ms = 500.5\n", Path("s.toml"))
    assert scenario.goodput == {"tpot_ms": 20.0, "ttft_ms": 500.5}
    assert parse_scenario(BASE, Path("s.toml")).goodput == {}
    with pytest.raises(ScenarioError, match=r"s\.toml:9: `goodput\.itl_ms` is not a known key"):
        parse_scenario(BASE + "[goodput]\nitl_ms = 3\n", Path("s.toml"))
    with pytest.raises(ScenarioError, match=r"s\.toml:9: `goodput\.tpot_ms` must be a finite number in \(0,"):
        parse_scenario(BASE + "[goodput]\ntpot_ms = 0\n", Path("s.toml"))
    with pytest.raises(ScenarioError, match=r"s\.toml:9: `goodput\.e2e_ms` must be int or float"):
        parse_scenario(BASE + '[goodput]\ne2e_ms = "x"\n', Path("s.toml"))


def test_sim_step_slows_with_the_batch_and_more_with_spec_decode() -> None:
    """The simulator's load knob: step_ms + (per-stream + verify-if-K>0) × (rows in flight − 1)."""
    from itlaudit.serve.sim import SimConfig
    from itlaudit.serve.sim.engine import Engine

    def step(k: int, in_flight: int) -> float:
        config = SimConfig(
            step_ms=10, num_speculative_tokens=k, batch_slowdown_ms_per_stream=2, spec_verify_ms_per_stream=5
        )
        engine = Engine(config)
        engine.in_flight = in_flight
        return engine._step_ms()

    assert (step(0, 0), step(0, 1), step(0, 4), step(3, 4)) == (10, 10, 16, 31)
    assert Engine(SimConfig(step_ms=7))._step_ms() == 7  # off by default
