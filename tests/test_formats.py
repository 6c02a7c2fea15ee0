"""Format versions in run-folder files (model/formats.py): every file a run writes says its format,
a folder of the previous (unversioned) format reads as it is, and a newer or unknown one is one line.

tests/fixtures/runfolder-v1/ was written by `itlaudit run` on the simulator before versions existed
(2 variants x 3 requests, trimmed to requests.jsonl, meta.json, summary.json, its ledger lines and
one --save-result file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from simkit import itlaudit, sim_server

from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.summary import RunSummary
from itlaudit.errors import RecordsError
from itlaudit.model.formats import FORMAT, PREVIOUS_FORMAT, RECORDS_FORMAT, check_format
from itlaudit.serve.sim import SimConfig
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import load_records
from itlaudit.store.ledger import load_ledger, matrix
from itlaudit.store.result import result_json, save_result
from itlaudit.store.rundir import read_json
from itlaudit.workflows.sweep import CONFIG_FILE, SweepConfig, open_sweep_dir

FIXTURE = Path(__file__).parent / "fixtures" / "runfolder-v1"


@pytest.fixture()
def old_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "runfolder-v1"
    shutil.copytree(FIXTURE, folder)
    return folder


def _rewrite(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**read_json(path), **changes}), encoding="utf-8")


def test_the_fixture_is_of_the_previous_format() -> None:
    """Keeps the fixture honest: no file in it says a format, so it is format 1 by definition."""
    for name in ("meta.json", "summary.json", "result-K0.json"):
        assert "format" not in read_json(FIXTURE / name), name
    assert all("format" not in line for line in load_ledger(FIXTURE / "ledger.jsonl"))
    assert PREVIOUS_FORMAT == 1 and FORMAT == 2


def test_a_run_writes_its_format_into_every_file(tmp_path: Path) -> None:
    scenario = FIXTURE / "scenario.toml"
    with sim_server(SimConfig(step_ms=1.0, ttft_ms=2.0)) as url:
        done = itlaudit(
            "run", str(scenario), "--url", url, "--out", str(tmp_path / "run"), "--no-plots",
            "--ledger", str(tmp_path / "ledger.jsonl"), "--save-result", str(tmp_path / "result.json"),
            "--metadata", "format=mine",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    meta = read_json(run / "meta.json")
    assert (meta["format"], meta["records_format"]) == (FORMAT, RECORDS_FORMAT)
    assert read_json(run / "summary.json")["format"] == FORMAT
    ledger = load_ledger(tmp_path / "ledger.jsonl")
    assert [line["format"] for line in ledger] == [FORMAT, FORMAT]
    for variant in ("K0", "K3"):
        # vllm bench's result keys plus one: `format`, which a --metadata pair of that name does not hide
        assert read_json(tmp_path / f"result-{variant}.json")["format"] == FORMAT


def test_a_previous_format_folder_reads_as_it_is(old_folder: Path, tmp_path: Path) -> None:
    """The unversioned folder gives the result file it gave when written (plus `format`, and the
    `latencies` and `queue_times` vllm bench keeps, from its records, and max_concurrency read as
    vllm bench writes it), its ledger lines make the
    matrix, and `itlaudit report` re-derives it into the current format."""
    written = save_result(tmp_path / "again.json", old_folder)
    for path in written:
        variant = path.stem.removeprefix("again-")
        if variant == "K0":
            again = read_json(path)
            arrays = {key: again.pop(key) for key in ("latencies", "queue_times")}
            # max_concurrency is now vllm bench's: null where the cap (3) cannot bind (3 requests)
            assert again == {
                **read_json(FIXTURE / "result-K0.json"),
                "format": FORMAT,
                "max_concurrency": None,
            }
            assert [len(values) for values in arrays.values()] == [3, 3]
    assert [row["variant"] for row in matrix(load_ledger(old_folder / "ledger.jsonl"))] == ["K0", "K3"]
    assert len(load_records(old_folder / "requests.jsonl")) == 6

    old = read_json(old_folder / "summary.json")
    done = itlaudit("report", str(old_folder))
    assert done.returncode == 0, done.stderr
    new = read_json(old_folder / "summary.json")
    assert new["format"] == FORMAT
    for name in ("K0", "K3"):
        assert new["variants"][name]["findings"] == old["variants"][name]["findings"]
        assert new["variants"][name]["itl_ms"] == old["variants"][name]["itl_ms"]


@pytest.mark.parametrize("name", ["meta.json", "summary.json"])
def test_a_newer_file_is_one_line(old_folder: Path, tmp_path: Path, name: str) -> None:
    _rewrite(old_folder / name, format=7)
    line = f"{old_folder / name} is format 7, newer than this itlaudit reads ({FORMAT}); upgrade itlaudit"
    with pytest.raises(RecordsError) as caught:
        save_result(tmp_path / "result.json", old_folder)
    assert str(caught.value) == line
    if name == "meta.json":  # `report` reads meta.json first
        done = itlaudit("report", str(old_folder))
        assert done.returncode == 2
        assert line in done.stderr and "Traceback" not in done.stderr


def test_newer_records_are_refused_before_any_is_read(old_folder: Path) -> None:
    _rewrite(old_folder / "meta.json", format=FORMAT, records_format=RECORDS_FORMAT + 1)
    with pytest.raises(RecordsError, match=r"meta\.json is records_format 2, newer than this itlaudit"):
        load_records(old_folder / "requests.jsonl")


def test_a_newer_ledger_line_names_its_line(old_folder: Path) -> None:
    ledger = old_folder / "ledger.jsonl"
    lines = ledger.read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "format": FORMAT + 1})
    ledger.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"^ledger {ledger}:2 is format 3, newer than this itlaudit"):
        load_ledger(ledger)


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (
            0,
            "x.json is format 0, older than this itlaudit reads (1, 2); "
            "read it with the itlaudit that wrote it",
        ),
        ("2", "x.json: format '2' is not a format version; it was not written by itlaudit"),
        (True, "x.json: format True is not a format version; it was not written by itlaudit"),
    ],
)
def test_an_older_or_foreign_format_is_one_line(found: object, says: str) -> None:
    with pytest.raises(RecordsError) as caught:
        check_format("x.json", {"format": found})
    assert str(caught.value) == says


@pytest.mark.parametrize("data", [{}, {"format": 1}, {"format": FORMAT}, [1, 2]])
def test_current_and_previous_formats_pass(data: object) -> None:
    check_format("x.json", data)


def test_a_sweep_started_before_versions_resumes(tmp_path: Path) -> None:
    """sweep-config.json gained `format`: --resume compares what was asked, not the version, so a
    sweep of either format resumes and one of another format is one line."""
    config = SweepConfig(scenario="s", axis="concurrency", values=[1.0, 2.0], variants=["K0"])
    out = open_sweep_dir(tmp_path / "sweep", "s", config, resume=False)
    assert read_json(out / CONFIG_FILE)["format"] == FORMAT
    assert open_sweep_dir(out, "s", config, resume=True) == out
    (out / CONFIG_FILE).write_text(json.dumps(config.to_json()), encoding="utf-8")  # format 1
    assert open_sweep_dir(out, "s", config, resume=True) == out
    _rewrite(out / CONFIG_FILE, format=9)
    with pytest.raises(RecordsError, match="is format 9, newer than this itlaudit reads"):
        open_sweep_dir(out, "s", config, resume=True)


def test_result_json_of_a_summary_in_memory_says_its_format() -> None:
    summary = RunFiles(FIXTURE).summary
    meta = RunFiles(FIXTURE).meta_file
    assert result_json(summary, meta, "K3")["format"] == FORMAT


def test_the_typed_summary_encodes_to_the_file_it_replaced() -> None:
    """summarize_run's struct is summary.json key for key and in order: the fixture's summary.json,
    written by the dict-building code from the same records, is what it encodes to (bar `records`,
    which write_derived adds)."""
    written = read_json(FIXTURE / "summary.json")
    del written["records"]
    typed = summarize_run(load_records(FIXTURE / "requests.jsonl"), ["K0", "K3"])
    assert json.dumps(typed.to_json()) == json.dumps(written)
    assert typed.variants["K3"].findings == written["variants"]["K3"]["findings"]
    # and the file's values fit the declared types (to_builtins alone would not check them)
    assert msgspec.convert(written, RunSummary) == typed
