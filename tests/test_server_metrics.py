"""The /metrics sampler and its series: against the simulator's moving gauges, and the pure parts."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiohttp import web
from reportkit import block
from simkit import app_on_thread, itlaudit, sim_server

from itlaudit.analysis.derive import by_category
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.request_acceptance import pooled_server_acceptance
from itlaudit.analysis.server_metrics import (
    KV_USAGE,
    QUEUE_TIME,
    RUNNING,
    WAITING,
    delta_row,
    parse_scrape,
    signal_changes,
    summarize_series,
    variant_server_figures,
)
from itlaudit.analysis.specdecode import DRAFTS
from itlaudit.analysis.summary import RunSummary
from itlaudit.model.codes import SPEC_DECODE_METRICS_DISAGREE
from itlaudit.model.launch import LaunchSpec
from itlaudit.report.diff import why_it_moved
from itlaudit.report.markdown import server_rows, server_section
from itlaudit.report.plots import VariantView, plot_server_timeline
from itlaudit.serve.launcher import launch
from itlaudit.serve.sim import SimConfig
from itlaudit.serve.truth import VLLM_METRICS_PAGE
from itlaudit.store.jsonl import load_records
from itlaudit.store.server_metrics import read_server_metrics
from itlaudit.telemetry.metrics_sampler import MetricsSampler

PAGE = """# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_running{{engine="1",model_name="m"}} 1
# HELP vllm:kv_cache_usage_perc KV.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.2
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.4
# HELP vllm:num_preemptions_total Preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempted}
# HELP vllm:request_queue_time_seconds Queue.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {fast}
vllm:request_queue_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {queued}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {queued_s}
vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {queued}
"""


def _page(running: int = 2, preempted: int = 0, fast: int = 0, queued: int = 0, queued_s: float = 0.0) -> str:
    return PAGE.format(running=running, preempted=preempted, fast=fast, queued=queued, queued_s=queued_s)


def test_scrape_sums_engines_and_averages_a_fraction() -> None:
    scrape = parse_scrape(_page(running=3))
    assert scrape.gauges["vllm:num_requests_running"] == 4
    assert abs(scrape.gauges[KV_USAGE] - 0.3) < 1e-9  # a per-engine fraction: averaged, not 0.6
    assert scrape.histograms[QUEUE_TIME] == {"0.5": 0.0, "+Inf": 0.0, "sum": 0.0, "count": 0.0}


def test_rows_hold_deltas_and_a_reset_counts_from_zero() -> None:
    first = parse_scrape(_page(preempted=5, fast=1, queued=2, queued_s=1.5))
    second = parse_scrape(_page(preempted=7, fast=1, queued=4, queued_s=3.5))
    restarted = parse_scrape(_page(preempted=1))
    base = {"t_ns": 0, **delta_row(first, None)}
    assert base["counters"]["vllm:num_preemptions_total"] == 0.0  # the baseline: nothing happened yet
    row = {"t_ns": 1_000_000_000, **delta_row(second, first)}
    assert row["counters"]["vllm:num_preemptions_total"] == 2.0
    assert row["histograms"][QUEUE_TIME] == {"0.5": 0.0, "+Inf": 2.0, "sum": 2.0, "count": 2.0}
    after_reset = {"t_ns": 2_000_000_000, **delta_row(restarted, second)}
    assert after_reset["counters"]["vllm:num_preemptions_total"] == 1.0
    figures = summarize_series([base, row, after_reset])
    assert figures["preemptions"] == 3.0
    assert figures["queue_time_mean_s"] == 1.0
    assert figures["prefix_hit_rate"] is None  # not exported: absent, not zero
    assert figures["span_s"] == 2.0


def _stream(url: str, prompt: str, tokens: int) -> None:
    body = {
        "model": "sim-tiny",
        "prompt": prompt,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def test_sampler_sees_the_simulator_move_with_load(tmp_path: Path) -> None:
    """Six requests on a 2-seat server: the series shows 2 running, some waiting, KV in use, time
    in the queue, prefix hits for the shared prompt, and acceptance per position with K=3."""
    config = SimConfig(num_speculative_tokens=3, acceptance_prob=0.7, max_num_seqs=2, step_ms=4)
    path = tmp_path / "server_metrics.jsonl"
    with sim_server(config) as url:
        sampler = MetricsSampler(url, path, "k3", period_s=0.05)
        sampler.start()
        prompt = "The same long opening sentence is shared by every request here. " * 4
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda i: _stream(url, prompt, 60), range(6)))
        info = sampler.stop()
    assert info["rows"] >= 5 and info["gave_up"] is None
    rows = read_server_metrics(tmp_path)["k3"]
    figures = summarize_series(rows)
    assert figures["running_max"] == 2
    assert figures["waiting_max"] and figures["waiting_max"] >= 1
    assert figures["kv_usage_max"] and figures["kv_usage_max"] > 0
    assert figures["queued_requests"] == 6 and figures["queue_time_mean_s"] > 0
    assert 0 < figures["prefix_hit_rate"] < 1  # the first request fills the cache, the other five hit
    generated = sum(r["counters"]["vllm:generation_tokens_total"] for r in rows)
    assert generated == 6 * 60  # deltas add up to the window's tokens
    per_pos = figures["acceptance_per_position"]
    assert per_pos and all(len(p["acceptance"]) == 3 for p in per_pos)
    assert per_pos[0]["acceptance"][0] >= per_pos[0]["acceptance"][2]  # a prefix: earlier accepts more


def test_sampler_gives_up_on_a_server_without_metrics(tmp_path: Path) -> None:
    app = web.Application()
    with app_on_thread(app) as url:
        sampler = MetricsSampler(url, tmp_path / "server_metrics.jsonl", "v", period_s=0.01)
        sampler.start()
        deadline = time.monotonic() + 10
        while sampler.gave_up is None and time.monotonic() < deadline:
            time.sleep(0.01)
        info = sampler.stop()
    assert info["rows"] == 0
    assert info["gave_up"] and "404" in info["gave_up"]
    assert read_server_metrics(tmp_path)["v"][-1]["error"] == info["gave_up"]


@pytest.mark.parametrize("thread_ran", [False, True], ids=["before-the-thread-runs", "after-it-runs"])
def test_a_signal_inside_the_samplers_start_leaves_stop_one_clean_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_ran: bool
) -> None:
    """SIGTERM during a sweep trial once landed inside the sampler's Thread.start() (which waits for the
    new thread): the run's way out called stop(), whose join() raised "cannot join thread before it is
    started" and printed a traceback instead of exiting 143. Here the signal is a KeyboardInterrupt
    raised from start(), before the thread was started or just after: stop() still closes the file
    with the first sample kept, and no sampler thread is left running."""
    real_start = threading.Thread.start

    def interrupted_start(thread: threading.Thread) -> None:
        if thread.name != "server_metrics:v":  # the scrape's own resolver threads start as usual
            return real_start(thread)
        if thread_ran:
            real_start(thread)
        raise KeyboardInterrupt

    with sim_server(SimConfig()) as url:
        sampler = MetricsSampler(url, tmp_path / "server_metrics.jsonl", "v", period_s=0.01)
        monkeypatch.setattr(threading.Thread, "start", interrupted_start)
        with pytest.raises(KeyboardInterrupt):
            sampler.start()
        monkeypatch.undo()
        info = sampler.stop()
    assert info["rows"] == 1  # the sample start() takes before its thread
    deadline = time.monotonic() + 5
    while any(t.name == "server_metrics:v" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "server_metrics:v" for t in threading.enumerate())
    assert len(read_server_metrics(tmp_path)["v"]) == 1


def _run_against(config: SimConfig, tmp_path: Path) -> Path:
    """`itlaudit run` (in-process) of 6 requests of 48 tokens against the simulator; the run folder."""
    with sim_server(config) as url:
        scenario = tmp_path / "s.toml"
        workload = (
            'prompts = ["Tell me a story about a cat."]\nnum_requests = 6\nconcurrency = 2\nmax_tokens = 48'
        )
        scenario.write_text(
            f'name = "acc"\n\n[workload]\n{workload}\n\n[[variants]]\nname = "k3"\nurl = "{url}"\n',
            encoding="utf-8",
        )
        out = tmp_path / "run"
        # a period well under the run's ~0.5 s, so samples fall inside its measured window
        result = itlaudit("run", str(scenario), "--out", str(out), "--metrics-period", "0.05")
    assert result.returncode == 0, result.stderr
    return out


def _findings(out: Path) -> list[dict[str, object]]:
    return [
        f
        for line in (out / "derived.jsonl").read_text().splitlines()
        for f in json.loads(line)["finding_details"]
    ]


def test_server_acceptance_agrees_with_the_stream(tmp_path: Path) -> None:
    """An honest per-request block: kept on every record, no finding, and the category figure is the
    server's own acceptance length."""
    config = SimConfig(num_speculative_tokens=3, acceptance_prob=0.5, per_request_spec_metrics=True)
    out = _run_against(config, tmp_path)
    records = load_records(out / "requests.jsonl")
    assert len(records) == 6 and all(r.spec_decode and r.spec_decode["num_spec_tokens"] == 3 for r in records)
    assert not [f for f in _findings(out) if f["code"] == SPEC_DECODE_METRICS_DISAGREE]
    for record in records:
        record.category = "story"
    lengths = [r.spec_decode["mean_acceptance_length"] for r in records if r.spec_decode]
    figures = by_category(records, [request_metrics(r) for r in records])["story"]["server_acceptance_length"]
    assert figures["p50"] == pytest.approx(statistics.median(lengths))
    pooled = pooled_server_acceptance(records)
    assert pooled is not None and 1.0 < pooled["acceptance_length"] < 4.0
    # The run sampled /metrics through its window (default period), and its report draws it.
    rows = read_server_metrics(out)["k3"]
    assert rows and sum(r["counters"]["vllm:generation_tokens_total"] for r in rows) == 6 * 48
    server = json.loads((out / "summary.json").read_text())["server"]["k3"]
    assert server["server_acceptance_length"] == pytest.approx(pooled["acceptance_length"])
    assert server["running_max"] is not None and (out / "server_timeline.png").is_file()
    meta = json.loads((out / "meta.json").read_text())["variants"]["k3"]
    assert meta["server_metrics"]["rows"] == len(rows) and meta["server_metrics"]["gave_up"] is None
    report = (out / "report.md").read_text()
    assert "Server during the measured window" in report
    # an attached server's speculation, as its per-request metrics tell it (no launch arguments to read)
    assert server["server_k"] == 3
    assert "**speculation k3**: K=3, as its per-request spec-decode metrics report it" in report


def test_server_acceptance_that_lies_is_a_finding(tmp_path: Path) -> None:
    """The simulator reports every draft accepted while it accepted half: the finding names both."""
    config = SimConfig(
        num_speculative_tokens=3, acceptance_prob=0.5, per_request_spec_metrics=True, spec_metrics_lie=True
    )
    out = _run_against(config, tmp_path)
    found = [f for f in _findings(out) if f["code"] == SPEC_DECODE_METRICS_DISAGREE]
    assert len(found) == 6
    evidence = found[0]["evidence"]
    assert evidence["server_accepted"] == 3 * evidence["server_steps"]
    assert evidence["server_accepted"] > evidence["stream_accepted_max"] + 3
    assert str(evidence["server_accepted"]) in found[0]["message"]


def test_timeline_and_report_section_draw_the_sampled_window(tmp_path: Path) -> None:
    """The sampler's rows from a loaded simulator drawn on the timeline and tabled in the report."""
    config = SimConfig(num_speculative_tokens=2, acceptance_prob=0.6, max_num_seqs=1, step_ms=3)
    with sim_server(config) as url:
        sampler = MetricsSampler(url, tmp_path / "server_metrics.jsonl", "k2", period_s=0.05)
        sampler.start()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: _stream(url, "A sentence for the server to continue.", 30), range(3)))
        sampler.stop()
    rows = read_server_metrics(tmp_path)["k2"]
    view = VariantView("k2", [], block(), telemetry={"server": rows})
    png = plot_server_timeline([view], tmp_path / "server_timeline.png")
    assert png is not None and png.stat().st_size > 10_000
    summary = RunSummary(
        variants={"k2": block()}, run_findings=[], server={"k2": variant_server_figures(rows, [], None)}
    )
    table = {row[0]: row[1] for row in server_rows(summary)}
    assert table["running requests max"] == "1" and float(table["waiting requests max"]) >= 1
    assert "KV-cache usage max" in table and "GPU SM clock p50" not in table  # no GPU: no row
    assert "## Server during the measured window" in server_section(summary)


def test_why_it_moved_lists_the_signals_that_changed() -> None:
    base = {"k3": {"kv_usage_p50": 0.20, "preemptions": 0.0, "running_max": 8.0, "gpu_throttle": []}}
    new = {
        "k3": {"kv_usage_p50": 0.90, "preemptions": 12.0, "running_max": 8.4, "gpu_throttle": ["hw_slowdown"]}
    }
    base["k3"]["acceptance_per_position"] = [0.8, 0.5]
    new["k3"]["acceptance_per_position"] = [0.8, 0.2]
    moved = {c.label: c for c in signal_changes(base, new)}
    assert set(moved) == {
        "KV-cache usage p50",
        "preemptions",
        "draft acceptance at position 2 (/metrics)",
        "GPU throttle reasons",
    }  # running max moved 5 %: under the 10 % a signal must move
    assert (moved["KV-cache usage p50"].base, moved["KV-cache usage p50"].new) == ("20.0%", "90.0%")
    assert moved["preemptions"].ratio is None and moved["GPU throttle reasons"].new == "hw_slowdown"
    assert signal_changes(base, base) == []


def test_a_signal_below_its_resolution_has_not_moved_and_no_table_writes_exponents() -> None:
    """Queue time 2.59e-07 s → 3.4e-07 s (issue 34: listed as a cause) is below a millisecond: not a
    move; a move of 40 ms is, and both figures read fixed-point."""
    tiny = signal_changes({"k3": {"queue_time_mean_s": 2.59e-07}}, {"k3": {"queue_time_mean_s": 3.4e-07}})
    assert tiny == []
    (moved,) = signal_changes({"k3": {"queue_time_mean_s": 0.002}}, {"k3": {"queue_time_mean_s": 0.042}})
    assert (moved.base, moved.new) == ("0.002 s", "0.042 s")


def test_a_gauge_with_no_sample_inside_the_window_is_a_dash_with_the_reason() -> None:
    """Samples taken only before the first request and after the last say 0 running and 0 % KV cache
    of a window they never saw: those gauges are "–" and the report says why; a sample inside the
    window gives the figure."""
    rows = [
        {"t_ns": t, "gauges": {RUNNING: 0.0, WAITING: 0.0, KV_USAGE: 0.0}, "counters": {}, "histograms": {}}
        for t in (1_000, 9_000_000_000)
    ]
    edges = variant_server_figures(rows, [], None, window=(500_000_000, 1_000_000_000))
    assert edges["running_max"] is None and edges["kv_usage_max"] is None and edges["samples_in_window"] == 0
    assert edges["note"] == "no /metrics sample in the 0.5 s window: lower --metrics-period"
    summary = RunSummary(variants={"k3": block()}, run_findings=[], server={"k3": edges})
    table = {row[0]: row[1] for row in server_rows(summary)}
    assert "running requests max" not in table and "KV-cache usage max" not in table
    assert table["why a gauge is –"] == "no /metrics sample in the 0.5 s window: lower --metrics-period"
    inside = [*rows, {**rows[0], "t_ns": 700_000_000, "gauges": {RUNNING: 3.0, WAITING: 1.0, KV_USAGE: 0.25}}]
    seen = variant_server_figures(inside, [], None, window=(500_000_000, 1_000_000_000))
    assert (seen["running_max"], seen["kv_usage_max"], seen["samples_in_window"]) == (3.0, 0.25, 1)
    assert "note" not in seen


def test_a_real_vllm_page_parses_into_the_series() -> None:
    """vLLM 0.32.0's own /metrics (the testbed, ngram K3, three short requests): the page the truth
    server serves to samplers."""
    scrape = parse_scrape(VLLM_METRICS_PAGE.decode())
    assert {RUNNING, WAITING, KV_USAGE} <= set(scrape.gauges)
    assert DRAFTS in scrape.counters and scrape.counters["vllm:generation_tokens_total"] > 0
    assert QUEUE_TIME in scrape.histograms and scrape.histograms[QUEUE_TIME]["count"] == 3
    assert not [k for k in [*scrape.gauges, *scrape.counters] if "_created" in k or "_info" in k]


def test_sim_command_line_lies_and_the_run_says_so(tmp_path: Path) -> None:
    """`itlaudit sim --per-request-spec-decode-metrics --spec-metrics-lie` in its own process, and
    `itlaudit run --url` against it: every request carries the block, and each is a finding."""
    argv = [sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--num-speculative-tokens", "3"]
    argv += ["--acceptance-prob", "0.5", "--per-request-spec-decode-metrics", "--spec-metrics-lie"]
    argv += ["--max-num-seqs", "1"]
    with launch(LaunchSpec(kind="command", command=argv, ready_timeout_s=30), tmp_path / "sim.log") as server:
        out = tmp_path / "run"
        result = itlaudit(
            "run", "--url", server.url, "--num-prompts", "3", "--max-tokens", "32", "--out", str(out)
        )
    assert result.returncode == 0, result.stderr
    assert "spec_decode_metrics_disagree" in (out / "report.md").read_text()
    assert len([f for f in _findings(out) if f["code"] == SPEC_DECODE_METRICS_DISAGREE]) == 3


def test_diff_lists_why_it_moved_with_both_figures() -> None:
    moved = signal_changes({"k3": {"preemptions": 2.0}}, {"k3": {"preemptions": 40.0}})
    lines = why_it_moved(moved)
    assert lines[0] == "### Why it moved"
    assert "| k3 | preemptions | 2 | 40 | 20.00× |" in lines
    assert why_it_moved([]) == []


def test_itlaudit_diff_says_why_it_moved(tmp_path: Path) -> None:
    """Two runs of one workload, the second against a server that seats one request at a time: the
    diff's figures move, and its last section names the waiting queue that moved them."""
    outs = []
    for name, seats in (("base", None), ("new", 1)):
        with sim_server(SimConfig(step_ms=3, max_num_seqs=seats)) as url:
            out = tmp_path / name
            flags = ["--num-prompts", "4", "--max-concurrency", "4", "--max-tokens", "40", "--out", str(out)]
            result = itlaudit("run", "--url", url, "--metrics-period", "0.05", *flags)
            assert result.returncode == 0, result.stderr
            outs.append(str(out))
    result = itlaudit("diff", *outs)
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("### Why it moved", 1)[1]
    assert "| waiting requests max | 0 |" in section and "time in the waiting queue, mean" in section
