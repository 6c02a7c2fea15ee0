"""JSON nested 100,000 deep where itlaudit reads a file (issue 39 item 2: a RecursionError traceback
in 6 commands): meta.json, a requests.jsonl line and a ledger line each end in one line naming the
file (and the line), exit 2, and the same folder undamaged reads as before. CI cost: ~6 s (four
`itlaudit` processes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from faultkit import itlaudit, one_error_line

from itlaudit.errors import RecordsError
from itlaudit.store.jsonl import iter_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "runfolder-v1"
DEEP = "[" * 100_000 + "]" * 100_000


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    return folder


@pytest.mark.fault_row("R2")
def test_a_deep_meta_json_is_one_line_naming_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    assert itlaudit("report", str(folder), cwd=tmp_path).returncode == 0  # the clean neighbour
    (folder / "meta.json").write_text(DEEP)
    line = one_error_line(itlaudit("report", str(folder), cwd=tmp_path))
    assert "meta.json: JSON nested deeper" in line


@pytest.mark.fault_row("R2")
def test_a_deep_records_line_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    lines = (folder / "requests.jsonl").read_text().splitlines()
    (folder / "requests.jsonl").write_text("\n".join([lines[0], DEEP, *lines[1:]]) + "\n")
    line = one_error_line(itlaudit("report", str(folder), cwd=tmp_path))
    assert "requests.jsonl:2: JSON nested deeper" in line


@pytest.mark.fault_row("R2")
def test_a_deep_ledger_line_is_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    ledger = folder / "ledger.jsonl"
    ledger.write_text(ledger.read_text() + DEEP + "\n")
    line = one_error_line(itlaudit("ledger", "--ledger", str(ledger), "add", str(folder), cwd=tmp_path))
    assert "JSON nested deeper" in line


def test_every_line_json_reads_reads_the_same_through_the_fast_decoder(tmp_path: Path) -> None:
    """iter_jsonl decodes with msgspec and falls back to json where msgspec refuses what json reads:
    NaN and Infinity, a number past a float's range, a lone surrogate escape, a big integer; a damaged
    line in the middle is still json's one-line refusal and a cut last line is still skipped. ~0 s."""
    lines = [
        '{"itl": 1.5, "ids": [1, 2]}',
        '{"itl": NaN, "tpot": Infinity}',
        '{"big": 1e400}',
        '{"text": "\\ud800"}',
        '{"n": 123456789012345678901234567890}',
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join([*lines, '{"cut": ']), encoding="utf-8")
    read = list(iter_jsonl(path))
    assert json.dumps(read) == json.dumps([json.loads(line) for line in lines])
    path.write_text("\n".join([lines[0], "{not json", lines[1]]), encoding="utf-8")
    with pytest.raises(RecordsError, match=r"requests.jsonl:2: not valid JSON \(Expecting property name"):
        list(iter_jsonl(path))
