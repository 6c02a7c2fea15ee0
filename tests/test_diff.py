"""diff verdicts on constructed runs, the --fail-on exit code, and the Markdown table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from reportkit import stream
from typer.testing import CliRunner

from itlaudit.analysis.run_diff import diff_runs
from itlaudit.cli.app import app
from itlaudit.errors import RecordsError
from itlaudit.model.records import RequestRecord, Status
from itlaudit.report.diff import render_diff
from itlaudit.store.jsonl import RecordWriter


def run(
    variant: str, n: int, *, step_ms: float = 10.0, tokens: int = 64, seed: int = 0
) -> list[RequestRecord]:
    return [stream(variant, i, step_ms=step_ms, tokens=tokens, jitter=0.05, seed=seed) for i in range(n)]


def verdict(diff, metric: str, variant: str = "K0") -> str:
    return next(m.comparison.verdict for m in diff.metrics if m.metric == metric and m.variant == variant)


def test_two_x_slowdown_is_worse() -> None:
    diff = diff_runs(run("K0", 20), run("K0", 20, step_ms=20.0, seed=1))
    assert verdict(diff, "itl_ms") == "worse"
    assert verdict(diff, "decode_tokens_per_s") == "worse"
    assert "**Worse:** K0 token ITL (ms)" in render_diff(diff, "a", "b")


def test_identical_is_same() -> None:
    base = run("K0", 20)
    diff = diff_runs(base, base)
    assert {m.comparison.verdict for m in diff.metrics} == {"same"}
    assert not diff.appeared and not diff.vanished


def test_three_vs_three_overlapping_is_unknown() -> None:
    diff = diff_runs(run("K0", 3), run("K0", 3, step_ms=10.5, seed=1))
    assert verdict(diff, "itl_ms") == "unknown"


def test_truncation_appearing_is_worse_and_listed() -> None:
    diff = diff_runs(run("K0", 10), run("K0", 10, tokens=16, seed=1))
    assert verdict(diff, "completion_tokens") == "worse"
    assert "truncated_below_max_tokens" in diff.appeared["K0"]
    diff_back = diff_runs(run("K0", 10, tokens=16), run("K0", 10, seed=1))
    assert "truncated_below_max_tokens" in diff_back.vanished["K0"]


def test_variants_in_one_run_only_are_listed_not_judged() -> None:
    diff = diff_runs(run("K0", 5), run("K0", 5) + run("K3", 5))
    assert diff.only_new == ["K3"]
    assert {m.variant for m in diff.metrics} == {"K0"}


def _write(folder: Path, records: list[RequestRecord]) -> Path:
    with RecordWriter(folder / "requests.jsonl") as writer:
        for record in records:
            writer.write(record.to_json())
    return folder


def test_fail_on_worse_exit_code(tmp_path: Path) -> None:
    base = _write(tmp_path / "base", run("K0", 12))
    slow = _write(tmp_path / "slow", run("K0", 12, step_ms=20.0, seed=1))
    runner = CliRunner()
    assert runner.invoke(app, ["diff", str(base), str(base), "--fail-on", "worse"]).exit_code == 0
    result = runner.invoke(app, ["diff", str(base), str(slow), "--fail-on", "worse"])
    assert result.exit_code == 1
    assert "| K0 | token ITL (ms) |" in result.output
    assert runner.invoke(app, ["diff", str(base), str(slow)]).exit_code == 0


def _meta(folder: Path, scenario: str) -> None:
    (folder / "meta.json").write_text(json.dumps({"scenario": scenario, "variants": {"K0": {}}}))


@pytest.mark.fault_row("27")
def test_diff_of_different_workloads_is_refused_unless_forced(tmp_path: Path) -> None:
    base = _write(tmp_path / "base", run("K0", 12))
    _meta(base, "short-decode")
    other = _write(
        tmp_path / "other", [replace(r, params=replace(r.params, max_tokens=128)) for r in run("K0", 12)]
    )
    _meta(other, "long-decode")
    runner = CliRunner()
    refused = runner.invoke(app, ["diff", str(base), str(other), "--fail-on", "worse"])
    assert isinstance(refused.exception, RecordsError)  # cli.main prints it as one line, exit 2
    assert refused.exception.exit_code == 2
    message = str(refused.exception)
    assert "ran different workloads" in message and "--force" in message
    assert "scenario short-decode vs long-decode" in message and '"max_tokens": 128' in message
    forced = runner.invoke(app, ["diff", str(base), str(other), "--force"])
    assert forced.exit_code == 0, forced.output
    same_workload = _write(tmp_path / "again", run("K0", 12, seed=3))
    _meta(same_workload, "short-decode")
    assert runner.invoke(app, ["diff", str(base), str(same_workload)]).exit_code == 0


def test_a_risen_error_rate_is_worse_even_when_every_new_request_failed(tmp_path: Path) -> None:
    failed = [replace(r, status=Status.HTTP_ERROR, http_status=500, error="boom") for r in run("K0", 12)]
    diff = diff_runs(run("K0", 12), failed)
    assert verdict(diff, "error_rate") == "worse"
    assert verdict(diff, "itl_ms") == "unknown"  # nothing left to time
    base = _write(tmp_path / "base", run("K0", 12))
    broken = _write(tmp_path / "broken", failed)
    result = CliRunner().invoke(app, ["diff", str(base), str(broken), "--fail-on", "worse"])
    assert result.exit_code == 1
    assert "| K0 | error rate | 0 | 1 |" in result.output
    one_more = [*run("K0", 11), failed[0]]
    assert verdict(diff_runs(run("K0", 12), one_more), "error_rate") == "worse"
    assert verdict(diff_runs(run("K0", 12), run("K0", 12, seed=2)), "error_rate") == "same"


def test_header_is_in_argument_order_and_unknown_rows_say_why() -> None:
    text = render_diff(diff_runs(run("K0", 3), run("K0", 3, step_ms=10.5, seed=1)), "runs/a", "runs/b")
    assert text.startswith("## itlaudit diff: `runs/a` (base) → `runs/b` (new)")
    row = next(line for line in text.splitlines() if line.startswith("| K0 | token ITL (ms) |"))
    assert "❔ unknown | 3 vs 3 samples cannot reach p < 0.05 |" in row


def test_a_completion_count_doubled_over_three_requests_shows_the_exact_p_beside_unknown() -> None:
    """3 × 128 vs 3 × 256 tokens: every value ties within its run, where the normal approximation
    gave p 0.047 beside an "unknown"; the exact p is 0.1, the smallest a 3-vs-3 split can reach."""
    diff = diff_runs(run("K0", 3, tokens=32), run("K0", 3, tokens=64, seed=1))
    tokens = next(m.comparison for m in diff.metrics if m.metric == "completion_tokens")
    assert (tokens.ratio, tokens.p_value, tokens.verdict) == (2.0, 0.1, "unknown")


def test_a_capped_base_leads_the_diff_as_not_comparable_and_nothing_is_better() -> None:
    capped, whole = run("K0", 12, tokens=16), run("K0", 12, step_ms=2.0, seed=1)
    diff = diff_runs(capped, whole)
    assert not diff.comparable("K0")
    assert verdict(diff, "itl_ms") == "better"  # the test's verdict stays for --fail-on ...
    text = render_diff(diff, "capped", "whole")
    lines = text.splitlines()
    assert lines[2] == "**K0: not comparable: base run: 12 of 12 requests capped at 16 tokens.**"
    assert "No metric is worse, which says nothing" in text
    assert "better" not in text.split("| variant |")[1]  # ... but the table never says it
    # The findings that vanished come before the table, not after it.
    assert text.index("Findings that vanished") < text.index("| variant |")
    assert verdict(diff_runs(whole, capped), "completion_tokens") == "worse"
    assert "❌ worse" in render_diff(diff_runs(whole, capped), "whole", "capped")
