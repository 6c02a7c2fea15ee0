"""selfcheck's verdict against the bar `--search` uses (1 ms p99 added lag, nothing stamped early,
every chunk stamped): PASS, WARN when only the tail is over it while the token-ITL means hold, FAIL
otherwise. Grades built by hand; tests/test_truth.py runs the command itself."""

from __future__ import annotations

import dataclasses

import pytest

from itlaudit.analysis.fidelity import Fidelity
from itlaudit.workflows.selfcheck import verdict

GOOD = Fidelity(
    responses=4,
    chunks=800,
    missing_chunks=0,
    unmatched_responses=0,
    lag_min_ms=-0.005,
    lag_p50_ms=0.002,
    lag_p99_ms=0.4,
    lag_max_ms=1.9,
    worst_itl_error=0.0001,
    worst_response="cmpl-1",
)


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({}, "PASS", "within the 1 ms p99 added-lag bar"),
        ({"lag_p99_ms": 1.0}, "PASS", "within"),  # the bar itself is in
        ({"lag_p99_ms": 2.118}, "WARN", "p99 2.118 ms): token-ITL means hold (worst error 0.01%)"),
        ({"lag_p99_ms": 2.118, "worst_itl_error": 0.05}, "FAIL", "token ITL off by up to 5.00%"),
        ({"lag_min_ms": -3.0, "worst_itl_error": 0.02}, "FAIL", "cannot audit this load"),
        ({"missing_chunks": 3}, "FAIL", "chunks went unstamped"),
    ],
)
def test_verdict(change: dict[str, object], status: str, words: str) -> None:
    found, meaning = verdict(dataclasses.replace(GOOD, **change))
    assert found == status and words in meaning, meaning
