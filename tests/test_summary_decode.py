"""summary.json read back as RunSummary: every fixture folder (the previous format's among them, whose
blocks predate `model`, `benchmark`, `stamp` and the lags) decodes, and a file that is no summary is
one RecordsError line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from itlaudit.analysis.summary import RunSummary
from itlaudit.errors import RecordsError
from itlaudit.store.folder import RunFiles

FIXTURES = Path(__file__).parent / "fixtures"
SUMMARIES = sorted(FIXTURES.rglob("summary.json"))


def _read(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: str(p.parent.relative_to(FIXTURES)))
def test_every_fixture_summary_decodes(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    summary = RunSummary.from_json(data, path)
    assert list(summary.variants) == list(data["variants"])
    for name, block in summary.variants.items():
        assert block.requests == data["variants"][name]["requests"]
        assert block.distributions["itl_ms"] == data["variants"][name]["itl_ms"]


def test_a_block_written_before_model_and_benchmark_reads_them_empty() -> None:
    old = FIXTURES / "vllm-0.24.0-cuda-h200-prev" / "c1-cudagraph" / "summary.json"
    data = json.loads(old.read_text(encoding="utf-8"))
    assert all("model" not in b and "benchmark" not in b for b in data["variants"].values())
    for block in RunSummary.from_json(data, old).variants.values():
        assert block.model is None
        assert block.benchmark == {}


def test_a_summary_of_the_current_format_round_trips() -> None:
    current = [p for p in SUMMARIES if "model" in json.dumps(_read(p))]
    assert current
    data = _read(current[0])
    data.pop("format", None)
    assert RunSummary.from_json(data, current[0]).to_json() == data


def test_a_file_that_is_no_summary_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    with pytest.raises(RecordsError, match=r"not a summary this itlaudit reads.*itlaudit report") as caught:
        RunSummary.from_json({"variants": {"K0": {"requests": "six"}}}, path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: str(p.parent.relative_to(FIXTURES)))
def test_the_one_reader_gives_every_fixture_folder_its_summary_typed(path: Path) -> None:
    """RunFiles (RunFolder.open) reads each fixture folder's summary.json, of either format, once."""
    run = RunFiles(path.parent)
    assert run.summary == RunSummary.from_json(_read(path), path)
    assert run.summary is run.summary
