"""The finding-code registry is the one definition: the findings table in docs/audits.md agrees with
it, and every rule emits only registered codes at a registered severity. Statuses and verdicts are
enums whose strings are what the files hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from itlaudit.analysis import comparison, distribution, findings, lossless
from itlaudit.errors import RecordsError
from itlaudit.model.codes import (
    CODES,
    REGISTRY,
    TRUNCATION_CODES,
    FindingCode,
    Scope,
    Severity,
    codes_in,
)
from itlaudit.model.records import RequestParams, RequestRecord, Status
from itlaudit.model.vocabulary import Shift
from itlaudit.store.jsonl import load_records

TABLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "audits.md"
_ROW = re.compile(
    r"^\| `(?P<code>[a-z0-9_]+)` \| (?P<scope>[a-z]+) \| (?P<severity>[a-z /]+) \| (?P<meaning>.+) \|$"
)


def table_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """code → (scope, severity, meaning) from the findings table of docs/audits.md."""
    start = text.index("| code | scope | severity | meaning |")
    rows: dict[str, tuple[str, str, str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        match = _ROW.match(line)
        assert match, (
            f"docs/audits.md: findings row not of the form | `code` | scope | severity | meaning |: {line}"
        )
        assert match["code"] not in rows, f"docs/audits.md lists {match['code']} twice"
        rows[match["code"]] = (match["scope"], match["severity"], match["meaning"])
    return rows


def table_row(entry: FindingCode) -> str:
    """The table line for a registry entry (what to paste into docs/audits.md when a code is added)."""
    return f"| `{entry.code}` | {entry.scope} | {' / '.join(entry.severities)} | {entry.meaning} |"


def test_docs_table_lists_exactly_the_registered_codes() -> None:
    rows = table_rows(TABLE_PAGE.read_text(encoding="utf-8"))
    missing = [table_row(REGISTRY[c]) for c in CODES if c not in rows]
    assert not missing, "add to the findings table in docs/audits.md:\n" + "\n".join(missing)
    assert not set(rows) - set(CODES), f"docs/audits.md lists unknown codes: {sorted(set(rows) - set(CODES))}"
    assert list(rows) == list(CODES), "docs/audits.md's table is not in registry order"


def expected(entry: FindingCode) -> tuple[str, str, str]:
    return (entry.scope, " / ".join(entry.severities), entry.meaning)


@pytest.mark.parametrize("code", CODES)
def test_docs_row_agrees_with_the_registry(code: str) -> None:
    rows = table_rows(TABLE_PAGE.read_text(encoding="utf-8"))
    assert rows[code] == expected(REGISTRY[code]), f"docs/audits.md row:\n{table_row(REGISTRY[code])}"


def test_docs_check_notices_a_changed_row() -> None:
    """The check is not vacuous: a row whose meaning or severity differs reads back differently."""
    text = TABLE_PAGE.read_text(encoding="utf-8")
    entry = REGISTRY["common_cap"]
    changed = table_rows(text.replace(entry.meaning, "something else", 1))
    assert changed["common_cap"] != expected(entry)
    downgraded = table_rows(
        text.replace(table_row(entry), table_row(entry).replace("| error |", "| warning |"))
    )
    assert downgraded["common_cap"] != expected(entry)


def test_one_line_meanings_and_unique_codes() -> None:
    assert len(set(CODES)) == len(CODES) == len(REGISTRY)
    for entry in REGISTRY.values():
        assert entry.meaning and "\n" not in entry.meaning and "|" not in entry.meaning, entry.code
        assert entry.severities and len(set(entry.severities)) == len(entry.severities), entry.code


def test_rule_modules_emit_registered_codes() -> None:
    assert set(findings.CODES) == set(codes_in(Scope.REQUEST, Scope.VARIANT))
    assert set(CODES) - set(findings.CODES) == {
        comparison.ACCEPTANCE_LENGTH_MISMATCH,
        comparison.STREAM_BUNDLED,
        lossless.SPEC_DECODE_OUTPUT_MISMATCH,
        distribution.SPEC_DECODE_DISTRIBUTION_SHIFT,
    }


def test_truncation_is_the_length_codes() -> None:
    assert {
        "truncated_below_max_tokens", "reasoning_truncated", "min_tokens_violated", "ignore_eos_violated"
    } == TRUNCATION_CODES  # fmt: skip


def test_a_finding_takes_the_registry_severity_and_refuses_an_unregistered_one() -> None:
    found = findings.Finding.of("common_cap", "m", {})
    assert found.severity is Severity.ERROR and found.to_json()["severity"] == "error"
    assert findings.Finding.of("usage_missing", "m", {}, severity=Severity.WARNING).severity == "warning"
    with pytest.raises(ValueError, match="common_cap is registered as error"):
        findings.Finding.of("common_cap", "m", {}, severity=Severity.WARNING)
    with pytest.raises(KeyError):
        findings.Finding.of("not_a_code", "m", {})


def test_from_json_round_trips() -> None:
    found = findings.Finding.of("http_error", "m", {"http_status": 500}, "K0-00001")
    assert findings.Finding.from_json(found.to_json()) == found


def test_status_is_written_as_its_plain_string_and_read_back_as_the_enum(tmp_path: Path) -> None:
    record = RequestRecord("K0-00000", "K0", "completions", "u", "m", RequestParams(), status=Status.TIMEOUT)
    line = msgspec.json.encode(record.to_json())
    assert b'"status":"timeout"' in line
    path = tmp_path / "requests.jsonl"
    path.write_bytes(line + b"\n")
    assert load_records(path)[0].status is Status.TIMEOUT


def test_an_unknown_status_on_disk_is_one_clear_error(tmp_path: Path) -> None:
    data = RequestRecord("K0-00000", "K0", "completions", "u", "m", RequestParams()).to_json()
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({**data, "status": "exploded"}) + "\n", encoding="utf-8")
    with pytest.raises(RecordsError, match="'exploded' is not a valid Status"):
        load_records(path)


def test_verdicts_keep_their_strings() -> None:
    assert [str(v) for v in Shift] == ["better", "worse", "same", "unknown"]
