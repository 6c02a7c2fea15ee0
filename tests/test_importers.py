"""Other tools' result files filed under what they measure: the real vllm bench serve JSON of the CPU
testbed, and an AIPerf profile_export_aiperf.json built from AIPerf's documented field names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reportkit import k0_k3
from typer.testing import CliRunner

from itlaudit.analysis.importers import AIPERF, VLLM_BENCH, parse_import
from itlaudit.cli.app import app
from itlaudit.errors import RecordsError
from itlaudit.store.jsonl import RecordWriter

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
VLLM_K3 = FIXTURES / "vllm-bench-serve-0.32.0-k3.json"

AIPERF_EXPORT = {
    "time_to_first_token": {"unit": "ms", "avg": 95.0, "p50": 94.0, "p99": 120.0},
    "inter_token_latency": {"unit": "ms", "avg": 7.7, "p50": 7.6, "p90": 8.0, "p99": 8.4},
    "inter_chunk_latency": {"unit": "ns", "avg": 30_500_000, "p50": 30_200_000},
    "request_latency": {"unit": "ms", "avg": 583.0, "p50": 584.0},
    "output_sequence_length": {"unit": "tokens", "avg": 64.0, "p50": 64.0},
    "request_count": {"unit": "requests", "avg": 8.0},
    "input_config": {"endpoint": {"model_names": ["tiny"], "streaming": True}},
}


def test_real_vllm_bench_itl_is_filed_as_chunk_itl_and_token_itl_recomputed() -> None:
    imp = parse_import(json.loads(VLLM_K3.read_text()), VLLM_K3.name)
    assert imp.tool == VLLM_BENCH and imp.model == "tiny" and imp.requests == 8
    chunk, token = imp.figures["chunk_itl_ms"], imp.figures["itl_ms"]
    assert chunk["mean"] == pytest.approx(30.488, abs=1e-3)  # its own mean_itl_ms
    assert imp.figures["tokens_per_chunk"]["p50"] == pytest.approx(64 / 17)  # 1 + 4×15 + 3 per request
    assert chunk["p50"] / token["p50"] == pytest.approx(3.7, abs=0.2)
    assert imp.figures["completion_tokens"]["p50"] == 64
    assert any("acceptance length: 4.00" in note for note in imp.notes)


def test_vllm_bench_without_detailed_lists_keeps_its_aggregates() -> None:
    imp = parse_import({"mean_itl_ms": 30.0, "median_itl_ms": 29.0, "mean_tpot_ms": 7.5}, "x.json")
    assert imp.figures["chunk_itl_ms"]["p50"] == 29.0
    assert "itl_ms" not in imp.figures
    assert any("--save-detailed" in note for note in imp.notes)


def test_aiperf_itl_is_tpot_and_units_are_converted() -> None:
    imp = parse_import(AIPERF_EXPORT, "profile_export_aiperf.json")
    assert imp.tool == AIPERF and imp.model == "tiny" and imp.requests == 8
    assert imp.figures["tpot_ms"]["p50"] == 7.6
    assert imp.figures["chunk_itl_ms"]["mean"] == pytest.approx(30.5)  # ns → ms
    assert imp.figures["completion_tokens"]["mean"] == 64.0
    assert "itl_ms" not in imp.figures  # aggregates only: no token ITL to recompute


@pytest.mark.parametrize("data", [{"foo": 1}, [1, 2], "text"])
def test_unknown_format_is_a_one_line_error(data: object) -> None:
    with pytest.raises(RecordsError, match="not a `vllm bench serve"):
        parse_import(data, "what.json")


def test_report_import_puts_the_table_beside_the_variant(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RecordWriter(run / "requests.jsonl") as writer:
        for record in k0_k3(3, capped=False):
            writer.write(record.to_json())
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(run), "--import", f"K3={VLLM_K3}"])
    assert result.exit_code == 0, result.output
    md = (run / "report.md").read_text()
    assert "## vllm bench serve (vllm-bench-serve-0.32.0-k3.json) beside itlaudit K3" in md
    assert "| chunk ITL (ms) | ITL (mean\\_itl\\_ms" in md  # escaped: no tool string is markup
    assert "beside itlaudit K3" in (run / "report.html").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert runner.invoke(app, ["report", str(run), "--import", str(bad)]).exit_code != 0
