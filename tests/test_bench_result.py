"""vllm bench serve's result, from itlaudit: the run-level figures on hand-built records (duration,
token totals and throughputs as vllm bench defines them, integers as integers), the terminal block
laid out as vllm bench's, and the --save-result JSON against the key set of a file written by the
real `vllm bench serve` (tests/fixtures/imports/README.md says how it was made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from reportkit import k0_k3
from simkit import itlaudit, sim_server

from itlaudit.analysis.benchmark import benchmark_figures
from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.metrics import request_metrics
from itlaudit.model.meta import Meta, MetaVariant
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status
from itlaudit.report.terminal import WIDTH, result_block
from itlaudit.serve.sim import SimConfig
from itlaudit.store.result import PER_REQUEST_ARRAYS, result_json, result_paths

FIXTURES = Path(__file__).parent / "fixtures"
# Real vllm bench serve results: 0.32.0 (CPU testbed, --metric-percentiles 50,90,99, e2el, spec
# decode) and 0.24.0 (H200, its default p99 only).
VLLM_032 = FIXTURES / "imports" / "vllm-bench-serve-0.32.0-k3.json"
VLLM_024 = FIXTURES / "vllm-0.24.0-cuda-h200-runs" / "parity-h200" / "batch-1" / "round-1" / "vllm.json"


def request(
    index: int,
    sent_ms: float | None,
    e2e_ms: float | None,
    prompt_tokens: int | None,
    tokens: int,
    *,
    status: Status = Status.OK,
    request_id: str | None = None,
) -> RequestRecord:
    """One token per chunk every 10 ms from a 20 ms TTFT, sent `sent_ms` after the variant began."""
    t_ms = [20.0 + 10.0 * i for i in range(tokens)]
    return RequestRecord(
        request_id=request_id or f"A-{index}",
        variant="A",
        endpoint="completions",
        url="http://127.0.0.1:1/v1/completions",
        model="tiny",
        params=RequestParams(max_tokens=tokens),
        status=status,
        prompt_tokens=prompt_tokens,
        completion_tokens=tokens,
        e2e_ms=e2e_ms,
        sent_offset_ms=sent_ms,
        chunks=ChunkSeries(
            t_ms=t_ms,
            completion_tokens=list(range(1, tokens + 1)),
            text_len=[1] * tokens,
            has_choice=[True] * tokens,
            token_ids=[None] * tokens,
        ),
    )


RECORDS = [
    request(0, 0.0, 100.0, 10, 7),
    request(1, 50.0, 200.0, 10, 4),  # the last to end among the successful: 250 ms
    request(2, 100.0, 100.0, None, 2),  # the server sent no usage.prompt_tokens
    request(3, 300.0, None, 10, 1, status=Status.CONNECTION_ERROR),  # failed, ends at its chunk: 320 ms
]


def figures(records: list[RequestRecord]) -> dict[str, Any]:
    return benchmark_figures(records, [request_metrics(r) for r in records])


def test_duration_totals_and_throughputs_as_vllm_bench_defines_them() -> None:
    bench = figures(RECORDS)
    assert (bench["completed"], bench["failed"]) == (3, 1)
    assert bench["duration_s"] == pytest.approx(0.320)  # first send to the last end, failed included
    # Token totals over the successful requests only; an unknown prompt count is counted apart.
    assert (bench["total_input_tokens"], bench["input_tokens_unknown"]) == (20, 1)
    assert bench["total_output_tokens"] == 13
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        assert type(bench[key]) is int, key
    assert bench["request_throughput"] == pytest.approx(3 / 0.320)
    assert bench["output_throughput"] == pytest.approx(13 / 0.320)
    assert bench["total_token_throughput"] == pytest.approx(33 / 0.320)
    # TPOT over requests with more than one output token: (e2e − ttft) / (tokens − 1).
    assert bench["tpot_ms"]["count"] == 3
    assert bench["tpot_ms"]["mean"] == pytest.approx(((100 - 20) / 6 + (200 - 20) / 3 + (100 - 20) / 1) / 3)
    assert bench["e2el_ms"]["p50"] == pytest.approx(100.0)
    assert bench["ttft_ms"]["mean"] == pytest.approx(20.0)


def test_appended_rounds_add_their_durations() -> None:
    """--append rounds restart the offsets at zero: their spans add up, they do not overlap."""
    again = [request(i, 0.0, 100.0, 10, 3, request_id=f"A.r2-{i}") for i in range(2)]
    assert figures([*RECORDS[:2], *again])["duration_s"] == pytest.approx(0.250 + 0.100)


def test_records_without_dispatch_offsets_have_no_duration() -> None:
    bench = figures([request(0, 0.0, 100.0, 10, 3), request(1, None, 100.0, 10, 3)])
    assert bench["duration_s"] is None and bench["request_throughput"] is None
    assert bench["total_output_tokens"] == 6


def test_terminal_block_reads_like_vllm_bench_and_marks_the_capped_variant() -> None:
    summary = summarize_run(k0_k3(3))
    meta = Meta(workload={"max_concurrency": 4}, variants={"K3-capped": MetaVariant(url="http://h:1")})
    block = result_block(summary, meta, "K3-capped")
    text = [line for line, _ in block]
    assert text[0] == f"{' Serving Benchmark Result: K3-capped ':=^{WIDTH}}"
    # The rule's label before any figure, styled apart.
    assert block[1] == ("K3-capped: not comparable: 3 of 3 requests capped at 16 tokens", "bold red")
    rows = {line[:40].strip(): line[41:] for line in text if len(line) > 41}
    assert rows["Successful requests:"] == "3"
    assert rows["Total generated tokens:"] == "48"  # an integer, never "48.0"
    assert rows["Maximum request concurrency:"] == "4"
    assert rows["Server:"] == "http://h:1, unknown (no /version)"
    assert "per chunk" in rows[""] and "per token" in rows[""]
    chunk_itl, token_itl = rows["Mean ITL (ms):"].split()
    # Counts 1, 5, 9, 13, 16 every 13 ms: four gaps over 15 decode tokens.
    assert float(chunk_itl) == pytest.approx(13.0) and float(token_itl) == pytest.approx(52 / 15, abs=0.005)
    assert rows["Tokens per decode chunk:"] == "3.75"
    # No --goodput: no goodput row; vllm bench's default percentiles: P99 alone, every metric's section
    assert (
        "Request goodput (req/s):" not in rows and "P90 TTFT (ms):" not in rows and "P99 E2EL (ms):" in rows
    )
    assert all(line == line.rstrip() for line in text)  # no trailing blanks in a CI log
    assert "K0" not in "".join(text)


def test_gpu_energy_is_in_the_block_and_the_result_file_where_nvml_gave_it() -> None:
    """The server block's energy (analysis.server_metrics.gpu_energy): a "GPU Energy" section in the
    terminal block and the same keys in the --save-result file; none of either without it. ~0 s."""
    summary = summarize_run(k0_k3(3))
    meta = Meta(workload={})
    energy = {"gpu_energy_j": 96.0, "gpu_joules_per_output_token": 2.0, "output_tokens_per_joule": 0.5}
    energy |= {"gpu_energy_per_gpu_j": {"0": 96.0}, "gpu_energy_source": "nvml_energy_counter"}
    with_energy = msgspec.structs.replace(summary, server={"K0": energy})
    rows = {line[:40].strip(): line[41:] for line, _ in result_block(with_energy, meta, "K0")}
    assert rows["GPU energy (J):"] == "96.00" and rows["Energy per output token (J):"] == "2.0000"
    assert rows["Output tokens per joule:"] == "0.50"
    saved = result_json(with_energy, meta, "K0")
    assert {k: saved[k] for k in energy} == energy
    plain = {line[:40].strip() for line, _ in result_block(summary, meta, "K0")}
    assert "GPU energy (J):" not in plain and "gpu_energy_j" not in result_json(summary, meta, "K0")


def test_one_result_file_per_variant_when_there_are_several(tmp_path: Path) -> None:
    assert result_paths(tmp_path / "r.json", ["A"]) == {"A": tmp_path / "r.json"}
    assert result_paths(tmp_path / "r.json", ["K0", "K3 capped/128"]) == {
        "K0": tmp_path / "r-K0.json",
        "K3 capped/128": tmp_path / "r-K3_capped_128.json",
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`itlaudit compare --save-result` (compare: /metrics gives the spec-decode keys) against a K3
    simulator, at a request rate, with a label and metadata."""
    where = tmp_path_factory.mktemp("saved")
    with sim_server(SimConfig(num_speculative_tokens=3, step_ms=5.0, ttft_ms=5.0)) as url:
        done = itlaudit(
            *("compare", "--url", url, "--dataset-name", "random", "--random-input-len", "16"),
            *("--random-output-len", "24", "--num-prompts", "6", "--max-concurrency", "2"),
            *("--request-rate", "200", "--label", "nightly", "--metadata", "gpu=none"),
            *("--out", str(where / "run"), "--ledger", str(where / "ledger.jsonl")),
            *("--save-result", str(where / "result.json")),
        )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads((where / "result.json").read_text())
    return result


@pytest.mark.parametrize("reference", [VLLM_032, VLLM_024], ids=["vllm-0.32.0", "vllm-0.24.0"])
def test_save_result_has_every_key_vllm_bench_writes(saved: dict[str, Any], reference: Path) -> None:
    """All of vllm bench's keys but its per-request arrays, with its value types: a dashboard that
    reads vllm bench results reads this file unchanged."""
    theirs = json.loads(reference.read_text())
    assert set(theirs) - PER_REQUEST_ARRAYS - set(saved) == set()
    for key, value in theirs.items():
        if key in PER_REQUEST_ARRAYS or value is None or saved[key] is None:
            continue
        # vllm bench writes a rate as a number, or "inf" for none (the 0.32.0 file has "inf").
        expected = (
            (float, str)
            if key == "request_rate"
            else (int, float)
            if isinstance(value, float)
            else type(value)
        )
        assert isinstance(saved[key], expected), (key, saved[key], value)
    # The two per-request arrays vllm bench keeps without --save-detailed: one value a request, seconds.
    assert len(saved["latencies"]) == len(saved["queue_times"]) == 6
    assert all(0 < s < 10 for s in saved["latencies"]) and all(q >= 0 for q in saved["queue_times"])


def test_save_result_keeps_vllm_bench_meanings_and_adds_the_token_itl(saved: dict[str, Any]) -> None:
    assert (saved["completed"], saved["failed"], saved["num_prompts"]) == (6, 0, 6)
    assert (saved["total_input_tokens"], saved["total_output_tokens"]) == (6 * 16, 6 * 24)
    assert saved["backend"] == saved["endpoint_type"] == "openai"
    assert (saved["request_rate"], saved["max_concurrency"], saved["burstiness"]) == (200.0, 2, 1.0)
    assert saved["label"] == "nightly" and saved["gpu"] == "none"  # --metadata at the top, as vllm bench
    assert saved["request_throughput"] == pytest.approx(6 / saved["duration"])
    # vllm bench's ITL is per chunk; the token ITL stands beside it, about 4 times smaller at K3.
    assert saved["mean_itl_ms"] / saved["mean_token_itl_ms"] == pytest.approx(
        saved["tokens_per_decode_chunk"], rel=1e-6
    )
    assert saved["tokens_per_decode_chunk"] > 3
    assert saved["spec_decode_acceptance_rate"] == pytest.approx(100.0)  # percent, as vllm bench
    assert saved["spec_decode_acceptance_length"] == pytest.approx(4.0)
    assert saved["comparable"] is True and saved["not_comparable_reason"] is None
    assert saved["request_goodput"] is None and "ttfts" not in saved  # no --goodput, no --save-detailed
    assert saved["simulated"] is True and saved["server_build"].startswith("itlaudit simulator")
