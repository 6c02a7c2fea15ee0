"""duration_s with streams longer than the duration: nothing is sent after it, a stream still open when
its grace (duration_grace_s, default 30 s) is over is cut (a timeout record, limit duration_cut_s) and
gets `cut_by_duration`, not `stream_stalled`; the terminal block counts the cut. Faults campaign
2026-12-04, row N13."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faultkit import itlaudit, url_variant, write_scenario

from itlaudit.analysis.findings import request_findings
from itlaudit.analysis.metrics import request_metrics
from itlaudit.errors import ScenarioError
from itlaudit.model.records import DURATION_CUT, ChunkSeries, RequestParams, RequestRecord, Status, Timeouts
from itlaudit.model.run_context import workload_meta
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.schedule import DURATION_GRACE_S
from itlaudit.store.ledger import variant_fingerprint


def _scenario(workload: str) -> str:
    return (
        'name = "t"\nendpoint = "completions"\n\n[workload]\nprompts = ["a sentence to send"]\n'
        f'{workload}\n\n[[variants]]\nname = "A"\nurl = "http://127.0.0.1:9/"\n'
    )


def test_the_cut_is_the_next_wait_once_it_is_the_nearest_limit() -> None:
    timeouts = Timeouts(stall_timeout_s=60.0, duration_cut_s=2.0, start_s=100.0)
    wait_s, limit = timeouts.next_wait(t0_ns=int(101e9), now_ns=int(101.5e9), started=True)
    assert limit == DURATION_CUT and wait_s == pytest.approx(0.5)
    sooner = Timeouts(stall_timeout_s=0.2, duration_cut_s=2.0, start_s=100.0)
    assert sooner.next_wait(int(101e9), int(101.5e9), True) == (0.2, "stall_timeout_s")
    unset = Timeouts(stall_timeout_s=60.0, duration_cut_s=2.0)  # no start yet: not armed
    assert unset.next_wait(int(101e9), int(101.5e9), True) == (60.0, "stall_timeout_s")


def test_the_grace_defaults_to_aiperfs_and_is_bounded() -> None:
    closed = parse_scenario(_scenario("num_requests = 6\nconcurrency = 2\nduration_s = 5"), Path("s.toml"))
    arrivals = closed.workload.arrivals
    assert arrivals.duration_grace_s == DURATION_GRACE_S == 30.0 and arrivals.cut_after_s == 35.0
    assert closed.workload.num_requests == 6  # a closed loop with duration_s takes its num_requests
    assert workload_meta(closed)["duration_grace_s"] == 30.0
    now = parse_scenario(_scenario("num_requests = 6\nduration_s = 5\nduration_grace_s = 0"), Path("s.toml"))
    assert now.workload.arrivals.cut_after_s == 5.0
    plain = parse_scenario(_scenario("num_requests = 6"), Path("s.toml"))
    assert plain.workload.arrivals.cut_after_s is None and workload_meta(plain)["duration_grace_s"] is None
    with pytest.raises(ScenarioError, match=r"duration_grace_s.*must be a finite number in \[0, 86400\] s"):
        parse_scenario(_scenario("num_requests = 6\nduration_s = 5\nduration_grace_s = -1"), Path("s.toml"))
    with pytest.raises(
        ScenarioError, match="duration_grace_s` is the grace after duration_s: set duration_s"
    ):
        parse_scenario(_scenario("num_requests = 6\nduration_grace_s = 1"), Path("s.toml"))


def test_the_default_grace_leaves_a_runs_ledger_fingerprint_as_it_was() -> None:
    """A repeat of a duration_s run recorded before the key existed is still named a repeat."""
    default, longer = (
        parse_scenario(_scenario(f"num_requests = 6\nduration_s = 5{extra}"), Path("s.toml"))
        for extra in ("", "\nduration_grace_s = 60")
    )
    arrivals = [variant_fingerprint(s, "A", {}).workload["arrivals"] for s in (default, longer)]
    assert "duration_grace_s" not in arrivals[0] and arrivals[0]["duration_s"] == 5.0
    assert arrivals[1]["duration_grace_s"] == 60.0  # another grace is another experiment


def _timed_out(limit: str) -> RequestRecord:
    return RequestRecord(
        request_id="A-00000",
        variant="A",
        endpoint="/v1/completions",
        url="http://x/v1/completions",
        model="tiny",
        params=RequestParams(max_tokens=30),
        status=Status.TIMEOUT,
        timeout_limit=limit,
        error="cut",
        completion_tokens=3,
        e2e_ms=1000.0,
        chunks=ChunkSeries(
            t_ms=[10.0, 20.0, 30.0],
            completion_tokens=[1, 2, 3],
            text_len=[1, 1, 1],
            has_choice=[True] * 3,
            token_ids=[None] * 3,
        ),
    )


@pytest.mark.parametrize(
    ("limit", "code"), [(DURATION_CUT, "cut_by_duration"), ("stall_timeout_s", "stream_stalled")]
)
def test_a_cut_at_the_runs_end_is_not_a_stall(limit: str, code: str) -> None:
    record = _timed_out(limit)
    found = {f.code: f for f in request_findings(record, request_metrics(record))}
    assert code in found and not {"cut_by_duration", "stream_stalled"} - {code} & set(found)
    if code == "cut_by_duration":
        assert found[code].severity == "warning" and "duration_s and its grace ran out" in found[code].message


def _run(tmp_path: Path, url: str, grace: float) -> tuple[list[dict], dict, str]:
    """Streams of ~3 s (30 tokens, 100 ms apart), 2 open at once, duration_s 0.5 s."""
    workload = (
        'prompts = ["a sentence to send"]\nnum_requests = 6\nconcurrency = 2\nmax_tokens = 30\n'
        f"temperature = 0\nduration_s = 0.5\nduration_grace_s = {grace}"
    )
    scenario = write_scenario(tmp_path, url_variant("A", url), workload, name=f"g{grace}".replace(".", "_"))
    out = tmp_path / f"run-{grace}"
    result = itlaudit("run", str(scenario), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text()), result.stdout


@pytest.mark.fault_row("N13")
def test_streams_open_past_duration_and_grace_are_cut_and_counted(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean", "--step-ms", "100")
    records, summary, stdout = _run(tmp_path, url, grace=0.5)
    assert len(records) == 2  # the first two, sent at 0 s; nothing after duration_s
    for record in records:
        assert record["status"] == "timeout" and record["timeout_limit"] == DURATION_CUT
        assert "cut at the run's end (1 s after its start" in record["error"]
        # Cut at duration_s + grace from the start, not before; late only by what the loaded box adds.
        assert 990 <= record["sent_offset_ms"] + record["e2e_ms"] <= 1500
    block = summary["variants"]["A"]
    assert block["findings"].get("cut_by_duration") == 2 and "stream_stalled" not in block["findings"]
    assert "Cut at the run's end (duration_s):       2" in stdout
    assert "A: not comparable: 2 of 2 requests failed" in stdout  # survivors are no speed


@pytest.mark.fault_row("N13")
def test_streams_within_the_grace_finish(faultserver, tmp_path: Path) -> None:
    url = faultserver("clean", "--step-ms", "100")
    records, summary, stdout = _run(tmp_path, url, grace=20)
    assert len(records) == 2  # still nothing sent after duration_s
    assert all(r["status"] == "ok" and r["completion_tokens"] == 30 for r in records)
    assert "cut_by_duration" not in summary["variants"]["A"]["findings"] and "Cut at" not in stdout
