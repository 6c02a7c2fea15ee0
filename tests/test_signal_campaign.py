"""The signal campaign (benchmarks/signal_campaign.py, issue 39 item 1) kept in CI: one case per command
(run, compare, sweep, smoke, bisect, track nightly), started as a script's background job (SIGINT
inherited ignored) and signalled at a moment drawn from a fixed seed, SIGINT and SIGTERM in turn. Every
case must be delivered (the command still running) and pass every grade: not lost (its own 130/143),
out within 5 s, no traceback, nothing left running, every folder finished or marked. The rounds are in
docs/faults.md. CI cost: ~18 s on the 2-core box (run 6 s, sweep 4.6 s, nightly 3.6 s, compare, bisect
and smoke ~1.4 s each)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from signal_campaign import COMMANDS, run_case

CASES = [
    (command, round(random.Random(n).uniform(0.3, 4.0), 2), ("INT", "TERM")[n % 2])
    for n, command in enumerate(COMMANDS)
]


@pytest.mark.fault_row("R11")
@pytest.mark.parametrize(("command", "delay", "signal"), CASES)
def test_a_signal_at_a_drawn_moment_is_handled(
    tmp_path: Path, command: str, delay: float, signal: str
) -> None:
    outcome, failed = run_case(0, command, delay, signal, tmp_path)
    assert outcome != "finished first", f"{command} ended before {delay} s: the case tested nothing"
    assert failed == [], outcome
