"""The arrival schedule as pure functions: rate, Poisson and gamma variability, the ramp, the seed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.schedule import Arrivals, RampUp, send_offsets_s


def intervals(offsets: list[float]) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], offsets]))


def cv(values: np.ndarray) -> float:
    return float(values.std() / values.mean())


def test_poisson_has_the_asked_rate_and_cv_one() -> None:
    offsets = send_offsets_s(20_000, Arrivals(request_rate=40.0), seed=1)
    assert offsets[-1] == pytest.approx(20_000 / 40.0)  # vLLM's rescaling: the last one is at n/rate
    gaps = intervals(offsets)
    assert gaps.mean() == pytest.approx(1 / 40, rel=1e-9)
    assert cv(gaps) == pytest.approx(1.0, abs=0.03)
    assert (gaps > 0).all()


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_gamma_burstiness_has_cv_one_over_sqrt_shape(shape: float) -> None:
    gaps = intervals(send_offsets_s(20_000, Arrivals(request_rate=10.0, burstiness=shape), seed=2))
    assert cv(gaps) == pytest.approx(1 / math.sqrt(shape), rel=0.05)
    assert gaps.mean() == pytest.approx(0.1, rel=1e-9)


def test_infinite_burstiness_is_evenly_spaced() -> None:
    gaps = intervals(send_offsets_s(50, Arrivals(request_rate=5.0, burstiness=math.inf), seed=0))
    assert gaps == pytest.approx([0.2] * 50)


def test_a_linear_ramp_speeds_up_from_start_to_end_rate() -> None:
    ramp = Arrivals(ramp_up=RampUp(start_rate=2.0, end_rate=20.0), burstiness=math.inf)
    gaps = intervals(send_offsets_s(10, ramp, seed=0))
    assert gaps[0] == pytest.approx(1 / 2.0)
    assert gaps[-1] == pytest.approx(1 / 20.0)
    assert gaps[5] == pytest.approx(1 / 12.0)  # request 5 of 10: 2 + 18 × 5/9 requests/s
    poisson = intervals(send_offsets_s(20_000, Arrivals(ramp_up=RampUp(2.0, 20.0)), seed=3))
    assert poisson[:1000].mean() > 4 * poisson[-1000:].mean()


def test_the_same_seed_gives_the_same_send_times_and_another_seed_does_not() -> None:
    arrivals = Arrivals(request_rate=4.0, burstiness=0.5)
    assert send_offsets_s(100, arrivals, seed=7) == send_offsets_s(100, arrivals, seed=7)
    assert send_offsets_s(100, arrivals, seed=7) != send_offsets_s(100, arrivals, seed=8)


def load(tmp_path: Path, workload: str) -> object:
    text = f'name = "t"\n[workload]\nprompts = ["a", "b"]\n{workload}\n[[variants]]\nname = "A"\n'
    return parse_scenario(text, tmp_path / "s.toml")


def test_arrival_keys_are_read_and_concurrency_is_only_a_cap(tmp_path: Path) -> None:
    scenario = load(tmp_path, "request_rate = 4\nburstiness = 0.5\nduration_s = 10\nwarmup_requests = 3")
    workload = scenario.workload  # type: ignore[attr-defined]
    assert workload.arrivals == Arrivals(request_rate=4.0, burstiness=0.5, duration_s=10.0, warmup_requests=3)
    assert workload.num_requests == 40  # fills duration_s at the rate
    assert workload.concurrency == 43  # no cap given: every request may be open
    capped = load(tmp_path, "request_rate = 4\nconcurrency = 2\nramp_up = { start_rate = 1, end_rate = 8 }")
    assert capped.workload.concurrency == 2  # type: ignore[attr-defined]
    assert capped.workload.arrivals.ramp_up == RampUp(1.0, 8.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ("request_rate = 0", "`workload.request_rate` must be a finite number in .0, 1000000. requests/s"),
        ("burstiness = 2", "set `request_rate` too"),
        ("request_rate = 1\nburstiness = -1", "`workload.burstiness` must be a finite number in .0.01,"),
        ("ramp_up = { start_rate = 1 }", "needs both rates"),
        ("duration_s = 5", "needs `num_requests` in a closed loop"),
        ("warmup_requests = -1", "must be an integer in .0, 1000000., got -1"),
    ],
)
def test_bad_arrival_keys_are_one_line(tmp_path: Path, workload: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
        load(tmp_path, workload)
