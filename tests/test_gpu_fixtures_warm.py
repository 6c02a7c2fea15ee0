"""The GPU lane's second H200 session (2026-12-03, vLLM 0.24.0 CUDA, itlaudit at c405e6e), replayed on CPU.

tests/fixtures/vllm-0.24.0-cuda-h200-runs/ holds, from `scripts/gpu/lane fidelity sweep ngram cudagraph
cap` with warmup requests in the scenarios: `sweep-c1-16-64/` (sweep.json, sweep-config.json and every
point's requests.jsonl/summary.json/point.json), `ngram-warm-c1/`, `cudagraph-warm-c1/`, `cap-warm-*/`
(run folders; /metrics trimmed to the spec-decode, TPOT and token counters) and `fidelity-idle-h200/`
(benchmarks/client_fidelity.py and `itlaudit selfcheck --streams 64` on the idle 16-CPU host; rerun in
the third session with the capture at 72fe615) and `parity-h200/` (benchmarks/bench_parity.py, third
session: vllm bench's result JSON without its per-request texts and gaps, itlaudit's summary.json, and
one round's raw records).
requests.jsonl has `chunk_token_ids` nulled except in cudagraph-warm-c1 (its mismatch findings read
them); nothing else is cut.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from itlaudit.analysis.comparison import CompareResult, build_comparison
from itlaudit.analysis.derive import derive_request, summarize_run
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.specdecode import CounterSnapshot, spec_decode_delta
from itlaudit.model.records import RequestRecord
from itlaudit.store.jsonl import iter_jsonl, load_records
from itlaudit.store.rundir import DERIVED_FILE, SUMMARY_FILE, write_json
from itlaudit.workflows.sweep import SweepConfig, build_sweep

RUNS = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda-h200-runs"
SWEEP = RUNS / "sweep-c1-16-64"


def _rederive_sweep(tmp_path: Path) -> dict[str, Any]:
    """sweep.json rebuilt from the raw records alone: each point's summary.json and derived.jsonl are
    recomputed here (the device's are thrown away), then the sweep is built as `itlaudit sweep` builds it,
    in sweep.json's form."""
    copy = tmp_path / "sweep"
    shutil.copytree(SWEEP, copy)
    for point in copy.glob("*/c*-t1"):
        records = load_records(point / "requests.jsonl")
        write_json(point / SUMMARY_FILE, summarize_run(records, [point.parent.name]).to_json())
        lines = [json.dumps(derive_request(r)) for r in records]
        (point / DERIVED_FILE).write_text("\n".join(lines) + "\n")
    config = SweepConfig(**json.loads((copy / "sweep-config.json").read_text()))
    return build_sweep(copy, "gpu-sweep", config).to_json()


# gibberish_suspected was recalibrated on real text (826f295: 210 Gemma 3 270M outputs, false positives
# 18.6% -> 0.5%) after these runs; the tiny random-weight model's word soup no longer fires it, so the
# device's counts of that one code are taken out before comparing. Every other finding must still match.
RECALIBRATED = "gibberish_suspected"


def _without_recalibrated(summary: dict[str, Any]) -> dict[str, Any]:
    for block in summary["variants"].values():
        block["findings"].pop(RECALIBRATED, None)
    return summary


def test_sweep_figures_recomputed_from_the_records_match_sweep_json(tmp_path: Path) -> None:
    rebuilt = _rederive_sweep(tmp_path)
    written = json.loads((SWEEP / "sweep.json").read_text())
    for variant, points in written["variants"].items():
        for point in points:
            folder = SWEEP / variant / f"c{point['concurrency']:g}-t1"
            device = json.loads((folder / SUMMARY_FILE).read_text())
            point["findings"] -= device["variants"][variant]["findings"].get(RECALIBRATED, 0)
    assert _same(rebuilt, written)
    points = {v: {p["concurrency"]: p for p in rebuilt["variants"][v]} for v in ("K0", "K3")}
    itl = {v: [round(points[v][c]["itl_ms"]["p50"], 2) for c in (1, 16, 64)] for v in points}
    assert itl == {"K0": [4.01, 3.58, 6.36], "K3": [2.59, 4.56, 2.85]}
    assert [round(points["K3"][c]["chunk_itl_ms"]["p50"], 2) for c in (1, 16, 64)] == [10.34, 18.17, 11.37]
    assert [p["requests"] for p in rebuilt["variants"]["K3"]] == [8, 16, 64]  # warmups left out
    # Goodput on ttft 1000 ms / tpot 8 ms: K3 meets it by token TPOT at every load, by chunk ITL at none.
    for p in rebuilt["variants"]["K3"]:
        assert p["goodput_rps"] == pytest.approx(p["requests_per_s"]) and p["goodput_chunk_rps"] == 0
    assert rebuilt["headline"] == [
        "K3 is faster per token up to concurrency 1 (1.55×); at 16, K0 is 1.27× faster."
    ]


def _same(a: Any, b: Any) -> bool:
    """Today's derivation `a` holds every figure the device wrote in `b`, equal (floats to 1e-9 relative:
    a JSON round trip). Keys added to the summary since the fixture was made (the run-level benchmark
    block, the model) are allowed; a figure that went missing or changed is not."""
    if isinstance(a, dict) and isinstance(b, dict):
        return b.keys() <= a.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9)
    return bool(a == b)


def _all_records(path: Path) -> list[RequestRecord]:
    """Every record of requests.jsonl, warmups included: what a server's /metrics window saw."""
    return [RequestRecord.from_json(obj) for obj in iter_jsonl(path)]


def test_k3_c16_point_is_a_cold_batch_stall_the_closed_loop_warmups_did_not_absorb() -> None:
    """The sweep's crossover at 16 is not steady state. At c16 the 2 warmups were sent with the first
    14 measured requests (a closed loop fills every slot at once), so the measured ones sat through the
    ~930 ms stall before the first 16-wide decode step, and a second stall (~227 ms) when the batch
    shrank; between them K3 ran 12.8 ms per 4-token chunk (3.2 ms a token), still under K0's 3.4."""
    records = _all_records(SWEEP / "K3" / "c16-t1" / "requests.jsonl")
    warm = [r for r in records if r.warmup]
    measured = [r for r in records if not r.warmup]
    assert len(warm) == 2 and len(measured) == 16
    warm_end = min((r.sent_offset_ms or 0.0) + (r.e2e_ms or 0.0) for r in warm)
    overlapping = [r for r in measured if (r.sent_offset_ms or 0.0) < warm_end]
    assert len(overlapping) == 14
    first = [r.chunks.t_ms[0] for r in overlapping]
    assert min(first) > 900 and max(first) < 1000  # every one waited for the first 16-wide step
    gaps = [b - a for r in overlapping for a, b in zip(r.chunks.t_ms[1:], r.chunks.t_ms[2:], strict=False)]
    assert round(statistics.median(gaps), 1) == 12.8 and max(gaps) > 200
    k0 = load_records(SWEEP / "K0" / "c16-t1" / "requests.jsonl")
    k0_gap = statistics.median(
        b - a for r in k0 for a, b in zip(r.chunks.t_ms, r.chunks.t_ms[1:], strict=False)
    )
    assert statistics.median(gaps) / 4 < k0_gap  # K3's steady per-token step beats K0's at 16 too


def _rederive(run: Path) -> tuple[list[RequestRecord], CompareResult]:
    """The comparison from requests.jsonl and meta.json's /metrics snapshots, as `itlaudit report` does."""
    meta = json.loads((run / "meta.json").read_text())
    records = load_records(run / "requests.jsonl")
    stats = {
        name: spec_decode_delta(CounterSnapshot.from_json(v["before"]), CounterSnapshot.from_json(v["after"]))
        for name, v in meta["variants"].items()
    }
    return records, build_comparison(summarize_run(records, list(meta["variants"])), records, stats)


def _accepted_on_stream(records: list[RequestRecord]) -> int:
    measured = [request_metrics(r) for r in records]
    tokens = sum((m.completion_tokens or 0) - 1 for m in measured)
    return tokens - sum(m.content_chunks - 1 for m in measured)


def test_ngram_stream_and_metrics_agree_once_the_warmups_in_the_window_are_counted() -> None:
    """compare's /metrics window holds the 2 warmup requests too, while its stream figures leave them
    out: on the device that made `acceptance_length_mismatch` fire (stream 2604 accepted tokens against
    /metrics' 3265, i.e. 8 of the window's 10 requests). Counting every request of the window, the stream
    and the server agree within 0.5%."""
    run = RUNS / "ngram-warm-c1"
    written = json.loads((run / "compare.json").read_text())
    assert [f["code"] for f in written["findings"]] == ["acceptance_length_mismatch"]
    ng = _rederive(run)[1].variants["NG"].spec_decode
    assert ng is not None
    records = _all_records(run / "requests.jsonl")
    window = [r for r in records if r.variant == "NG"]
    measured = [r for r in window if not r.warmup]
    assert (len(window), len(measured)) == (10, 8)
    assert _accepted_on_stream(measured) == 2604 and ng.num_accepted_tokens == 3265
    in_window = _accepted_on_stream(window)
    assert abs(in_window - ng.num_accepted_tokens) / ng.num_accepted_tokens < 0.005
    assert [round(p, 2) for p in ng.per_position_acceptance] == [0.79, 0.66, 0.64]


def test_ngram_and_cuda_graph_figures_quoted_in_the_readme() -> None:
    for run, variant, itl, chunk, speedup in [
        ("ngram-warm-c1", "NG", 1.44, 4.06, 2.38),
        ("cudagraph-warm-c1", "K3G", 2.00, 8.00, 1.36),
    ]:
        row = _rederive(RUNS / run)[1].variants[variant]
        assert (round(row.itl_ms_p50, 2), round(row.chunk_itl_ms_p50, 2)) == (itl, chunk)
        assert round(row.speedup_token_itl, 2) == speedup
    cmp = json.loads((RUNS / "cudagraph-warm-c1" / "compare.json").read_text())
    codes = [f["code"] for f in cmp["findings"]]
    assert codes == ["spec_decode_output_mismatch"] * 8  # eager K0 vs CUDA-graph K3G split at near-ties


@pytest.mark.parametrize(
    ("run", "tokens", "findings"),
    [
        ("cap-warm-explicit", 128, {"truncated_below_max_tokens": 4, "common_cap": 1}),
        ("cap-warm-omitted-chat", 128, {"truncated_below_max_tokens": 2}),
        ("cap-warm-omitted-cmpl", 16, {"truncated_below_max_tokens": 4, "common_cap": 1}),
    ],
)
def test_generation_config_cap_found_again_with_todays_code(run: str, tokens: int, findings: dict) -> None:
    """A server started with --override-generation-config max_new_tokens=128: explicit max_tokens 512 and
    chat without max_tokens stop at 128; completions without max_tokens stop at vLLM's default 16."""
    records = load_records(RUNS / run / "requests.jsonl")
    summary = summarize_run(records, ["CAP"]).to_json()
    written = json.loads((RUNS / run / "summary.json").read_text())
    assert _same(summary, written)
    block = summary["variants"]["CAP"]
    assert {r.completion_tokens for r in records} == {tokens}
    run_level = {f["code"]: 1 for f in summary["run_findings"]}
    assert {**block["findings"], **run_level} == findings


def test_client_fidelity_on_the_idle_h200_host() -> None:
    """benchmarks/client_fidelity.py --streams 1,16,64,128 --rounds 2 on the H200 host's 16 idle CPUs
    (lane at 72fe615, third H200 session): the per-trial grades reproduce the quoted medians and meet the
    issue's targets: itlaudit's p99 at most 1/3 of the naive client's at every load; at 64 streams p99
    <= 1 ms, max <= 5 ms and worst per-request token-ITL error <= 1 %."""
    trials = json.loads((RUNS / "fidelity-idle-h200" / "trials.json").read_text())
    assert len(trials) == 24

    def graded(client: str, streams: int) -> list[dict[str, Any]]:
        return [t["fidelity"] for t in trials if t["client"] == client and t["streams"] == streams]

    def p99(client: str, streams: int) -> float:
        return statistics.median(f["lag_p99_ms"] for f in graded(client, streams))

    loads = (1, 16, 64, 128)
    quoted = {(c, s): round(p99(c, s), 2) for c in ("itlaudit", "naive", "vllm") for s in loads}
    assert quoted == {
        ("itlaudit", 1): 0.02, ("itlaudit", 16): 0.02, ("itlaudit", 64): 0.0, ("itlaudit", 128): 0.01,
        ("naive", 1): 0.16, ("naive", 16): 0.36, ("naive", 64): 4.36, ("naive", 128): 301.97,
        ("vllm", 1): 0.07, ("vllm", 16): 0.47, ("vllm", 64): 1.83, ("vllm", 128): 8.95,
    }  # fmt: skip
    for streams in loads:
        assert p99("itlaudit", streams) <= p99("naive", streams) / 3
    at_64 = graded("itlaudit", 64)
    assert max(f["lag_p99_ms"] for f in at_64) <= 1.0
    assert max(f["lag_max_ms"] for f in at_64) <= 5.0
    assert max(f["worst_itl_error"] for f in at_64) <= 0.01
    assert all(t["fidelity"]["missing_chunks"] == 0 for t in trials)
    worst = max(t["fidelity"]["worst_itl_error"] for t in trials if t["client"] == "itlaudit")
    assert worst < 0.001
    selfcheck = (RUNS / "fidelity-idle-h200" / "selfcheck-64.txt").read_text()
    assert "p99 0.006 / max 2.072 ms over 32000 chunks; worst token-ITL error 0.05%" in selfcheck


PARITY = RUNS / "parity-h200"


def test_vllm_bench_serve_and_itlaudit_agree_within_5_percent_on_the_h200() -> None:
    """benchmarks/bench_parity.py (lane stage `parity`, twice): vllm bench serve --dataset-name random
    (input 256, output 128, rate 4, burstiness 1, 100 prompts) and the same scenario run by itlaudit, at
    once against one K0 server, 5 rounds a batch. Each round's mean TPOT from the two clients' own files
    (vllm bench's --save-result JSON, itlaudit's summary.json) agrees within 5 % in all 10 rounds, and the
    tables printed on the device are those files' ratios."""
    from itlaudit.analysis.importers import parse_import

    ratios = []
    for batch in (1, 2):
        printed = json.loads((PARITY / f"parity-{batch}.json").read_text())
        assert printed["workload"] == {
            "input_len": 256, "output_len": 128, "rate": 4.0, "burstiness": 1.0, "requests": 100
        }  # fmt: skip
        for index, quoted in enumerate(printed["rounds"], 1):
            folder = PARITY / f"batch-{batch}" / f"round-{index}"
            theirs = parse_import(json.loads((folder / "vllm.json").read_text()), "vllm.json")
            ours = json.loads((folder / "summary.json").read_text())["variants"]["A"]
            assert theirs.requests == ours["requests"] == 100
            assert theirs.figures["tpot_ms"]["mean"] == pytest.approx(quoted["bench_tpot_ms"])
            assert ours["tpot_ms"]["mean"] == pytest.approx(quoted["itlaudit_tpot_ms"])
            ratios.append(theirs.figures["tpot_ms"]["mean"] / ours["tpot_ms"]["mean"])
    assert len(ratios) == 10
    assert max(abs(r - 1) for r in ratios) <= 0.05
    assert [round(100 * (r - 1), 1) for r in ratios] == [2.1, -4.5, 3.2, 1.0, 0.9, -0.2, -2.8, 1.6, -0.8, 1.0]


def test_parity_round_figures_recomputed_from_the_records() -> None:
    """The kept round's summary.json is what today's code derives from its raw requests.jsonl."""
    folder = PARITY / "batch-1" / "round-1"
    records = load_records(folder / "requests.jsonl")
    assert len(records) == 100
    assert {r.prompt_tokens for r in records} == {256} and {r.completion_tokens for r in records} == {128}
    device = _without_recalibrated(json.loads((folder / "summary.json").read_text()))
    assert _same(summarize_run(records, ["A"]).to_json(), device)


def _client_fidelity() -> Any:
    """benchmarks/client_fidelity.py as a module (its table is what the lane prints)."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "benchmarks" / "client_fidelity.py"
    spec = importlib.util.spec_from_file_location("client_fidelity", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rate", [50, 100])
def test_client_fidelity_at_1024_streams_on_the_h200_host(rate: int) -> None:
    """512 and 1024 streams at a per-stream rate the truth server keeps (issue 24 item 7): itlaudit's
    worst request within 0.5% (measured: 0.0014% at most) and p99 added lag within 0.01 ms in every
    trial; the table leaves the trials where the server fell more than 10 ms behind out of its rows and
    names them (at 100 chunks/s, 1024 streams sit at the server's edge)."""
    bench = _client_fidelity()
    raw = json.loads((RUNS / "fidelity-1024-h200" / f"trials-{rate}cps.json").read_text())
    trials = [bench.TrialResult(**{**t, "fidelity": bench.Fidelity(**t["fidelity"])}) for t in raw]
    ours = [t for t in trials if t.client == "itlaudit"]
    assert {t.streams for t in ours} == {512, 1024} and len(ours) == 6
    assert max(t.fidelity.worst_itl_error for t in ours) <= 0.005
    assert max(t.fidelity.lag_p99_ms for t in ours) <= 0.01
    assert all(t.fidelity.missing_chunks == 0 for t in trials)
    bound = [t for t in trials if bench.server_bound(t)]
    assert all(t.server_lag_p99_ms > bench.SERVER_LAG_BUDGET_MS for t in bound)
    text = bench.table(trials, [512, 1024], ["itlaudit", "naive"], float(rate))
    if bound:
        assert "server-bound, left out of the rows above" in text
    else:
        assert "server-bound" not in text
    naive_1024 = [t for t in trials if t.client == "naive" and t.streams == 1024]
    if all(bench.server_bound(t) for t in naive_1024):
        assert "| 1024 | naive | server-bound: not graded |" in text
    assert "itlaudit: highest chunk rate" in text and f"{1024 * rate} chunks/s" in text
