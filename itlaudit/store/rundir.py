"""The run folder: where raw records land as they finish, and where derived files are written.

Layout: requests.jsonl (append-only, one raw line per finished request), derived.jsonl (the figures
and findings derived from each line, rewritten by every derivation), summary.json, requests.csv,
report.md, meta.json (what was run, against what); run.lock while a run writes (store.lock), and
partial/ for what `report --live` derived meanwhile, removed when the run ends. Only this module, the
lock and the JSONL writer touch it.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from itlaudit.errors import RunDirError
from itlaudit.model.formats import RECORDS_FORMAT, RECORDS_FORMAT_KEY, check_format, stamped
from itlaudit.model.jsonvalue import JSONMapping

REQUESTS_FILE = "requests.jsonl"
DERIVED_FILE = "derived.jsonl"
SUMMARY_FILE = "summary.json"
CSV_FILE = "requests.csv"
REPORT_FILE = "report.md"
META_FILE = "meta.json"
COMPARE_FILE = "compare.json"
PARTIAL_DIR = "partial"  # `report --live`'s files, apart from the run's own
DEFAULT_REPORTS = Path("reports")  # where a command given no --out makes its folder (new_run_dir)


def server_log_name(variant: str) -> str:
    """A launched server's log, beside the run's files."""
    return f"server-{variant}.log"


def new_run_dir(base: Path, scenario_name: str) -> Path:
    """reports/<scenario>-<UTC timestamp>/, never reusing a folder that already holds a run."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = base / f"{scenario_name}-{stamp}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = base / f"{scenario_name}-{stamp}-{suffix}"
    candidate.mkdir(parents=True)
    return candidate


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    """A JSON file; one that nests deeper than Python's decoders recurse (an attack, or a damaged file:
    itlaudit writes a few levels) is one RunDirError line naming it, not a RecursionError traceback."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except RecursionError:
        raise RunDirError(f"{path}: {TOO_DEEP}") from None


# What a JSON text nested past the decoder's recursion limit is said to be, wherever it is read.
TOO_DEEP = (
    "JSON nested deeper than Python's decoder reaches (~1000 levels; itlaudit writes a few): not a file "
    "itlaudit wrote, or a damaged one; repair or remove it"
)


def write_versioned(path: Path, data: Any) -> None:
    """A run-folder file (summary.json, compare.json, ...) with the current format version in it."""
    write_json(path, stamped(data))


def read_versioned(path: Path) -> Any:
    """A run-folder file, refused in one line when it is in a format this itlaudit does not read (the
    previous, unversioned one is read as it is). OSError and ValueError are the caller's, as read_json's."""
    data = read_json(path)
    check_format(path, data)
    return data


def write_meta(run_dir: Path, meta: Mapping[str, object]) -> None:
    """meta.json, saying also which record format requests.jsonl holds (see model/formats.py)."""
    write_versioned(run_dir / META_FILE, {**meta, RECORDS_FORMAT_KEY: RECORDS_FORMAT})


def write_jsonl(path: Path, lines: Sequence[JSONMapping]) -> None:
    """A whole derived file at once, replaced atomically, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines),
        encoding="utf-8",
    )
    tmp.replace(path)


def remove_partial(run_dir: Path) -> None:
    """Drop what `report --live` wrote while the run was going: the run's own files now say more."""
    shutil.rmtree(run_dir / PARTIAL_DIR, ignore_errors=True)
