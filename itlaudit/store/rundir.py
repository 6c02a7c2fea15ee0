"""The run folder: where raw records land as they finish, and where derived files are written.

Layout: requests.jsonl (append-only, one raw line per finished request), derived.jsonl (the figures
and findings derived from each line, rewritten by every derivation), summary.json, requests.csv,
report.md, meta.json (what was run, against what). Only this module and the JSONL writer touch it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from itlaudit.analysis.derive import derive_request, run_summary
from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.model.records import RequestRecord, load_records
from itlaudit.store.export import write_chunks

if TYPE_CHECKING:
    import pandas as pd

REQUESTS_FILE = "requests.jsonl"
DERIVED_FILE = "derived.jsonl"
SUMMARY_FILE = "summary.json"
CSV_FILE = "requests.csv"
REPORT_FILE = "report.md"
META_FILE = "meta.json"


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
    return json.loads(path.read_text(encoding="utf-8"))


def _csv_frame(records: Sequence[RequestRecord], derived: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per request: the raw scalars and the derived figures (chunk arrays stay in
    requests.jsonl, finding details in derived.jsonl)."""
    import pandas as pd  # pandas and matplotlib cost seconds to import: only when files are derived

    rows = []
    for record, figures in zip(records, derived, strict=True):
        line = {**record.to_json(), **figures}
        params = line.pop("params")
        row = {k: v for k, v in line.items() if not isinstance(v, list | dict) and k != "text"}
        row.update({f"param_{k}": v for k, v in params.items() if not isinstance(v, list)})
        row["findings"] = ";".join(figures["findings"])
        rows.append(row)
    return pd.DataFrame(rows)


def _write_jsonl(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    """A whole derived file at once, replaced atomically, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines),
        encoding="utf-8",
    )
    tmp.replace(path)


def _optional_json(path: Path) -> Any:
    """A file another command writes (compare.json) may be missing or half-written: then it is absent."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def write_derived(
    run_dir: Path,
    title: str,
    variant_order: Sequence[str] | None = None,
    *,
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
) -> dict[str, Any]:
    """(Re)derive summary.json, derived.jsonl, requests.csv, chunks.csv, the PNGs, report.md and
    report.html from requests.jsonl (plus compare.json's spec-decode figures when present)."""
    records = load_records(run_dir / REQUESTS_FILE)
    derived = [derive_request(r) for r in records]
    summary = run_summary(records, variant_order)
    write_json(run_dir / SUMMARY_FILE, summary)
    _write_jsonl(run_dir / DERIVED_FILE, derived)
    _csv_frame(records, derived).to_csv(run_dir / CSV_FILE, index=False)
    write_chunks(records, run_dir)
    findings = [f for d in derived for f in d["finding_details"]] + summary["run_findings"]
    compare = _optional_json(run_dir / "compare.json")  # compare.COMPARE_FILE; importing it is circular
    from itlaudit.report.writer import write_reports

    write_reports(run_dir, title, records, summary, findings, compare=compare, imported=imported)
    return summary
