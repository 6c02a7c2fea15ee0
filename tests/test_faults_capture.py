"""End-to-end CLI tests for the capture rows of the 2026-12-04 fault campaign (issue 23): a compressed
event stream (row 9), interleaved choices (row 12), capture workers outliving a killed coordinator (N2)
and a password in the URL (N15b). Each fault fires against a tests/faultserver.py mode, and a clean
neighbour (the same server code, the fault off) stays quiet."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from faultkit import itlaudit, url_variant, write_scenario

WORKLOAD = 'prompts = ["hi"]\nnum_requests = 2\nconcurrency = 1\nmax_tokens = 12\ntemperature = 0'


def run_one(
    start: Any, mode: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`itlaudit run` of WORKLOAD against a faultserver in MODE; the derived lines (record + findings)."""
    path = write_scenario(tmp_path, url_variant("A", start(mode)), WORKLOAD)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    derived = {}
    for text in (tmp_path / "run" / "derived.jsonl").read_text().splitlines():
        line = json.loads(text)
        derived[line["request_id"]] = line
    records = [json.loads(text) for text in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    return result, [{**record, **derived[record["request_id"]]} for record in records]


def codes(line: dict[str, Any]) -> set[str]:
    return set(line["findings"])


# --- row 9: a compressed event stream ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["gzip_sse", "deflate_sse", "plain_sse"])
def test_compressed_stream_is_decoded_with_a_stamp_per_read(faultserver, tmp_path: Path, mode: str) -> None:
    result, lines = run_one(faultserver, mode, tmp_path)
    assert result.returncode == 0, result.stderr
    for line in lines:
        assert line["status"] == "ok", line["error"]
        assert line["text"] == "".join(f" a{step}" for step in range(1, 13))
        assert len(line["chunk_t_ms"]) == 12  # one chunk per event, as uncompressed
        # The server flushes every 2 ms: decoded pieces keep their own reads' stamps, not one burst.
        assert len(set(line["chunk_t_ms"])) >= 6, line["chunk_t_ms"]
        assert codes(line) == set(), line["findings"]


def test_undecodable_coding_is_a_stream_error_naming_it(faultserver, tmp_path: Path) -> None:
    result, lines = run_one(faultserver, "br_sse", tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line["status"] for line in lines] == ["stream_error"] * 2
    assert all("Content-Encoding br" in line["error"] and line["text"] == "" for line in lines)


# --- row 12: a server that interleaves choices[].index -------------------------------------------


def test_interleaved_choices_are_a_finding_and_not_one_reply(faultserver, tmp_path: Path) -> None:
    result, lines = run_one(faultserver, "interleaved", tmp_path)
    assert result.returncode == 0, result.stderr
    for line in lines:
        assert "choices_interleaved" in codes(line), line["findings"]
        assert line["status"] == "stream_error" and "interleaved" in line["error"]
        assert line["other_index_chunks"] == 12
        assert line["text"] == "".join(f" a{step}" for step in range(1, 13))  # index 0's only
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["variants"]["A"]["errors"] == 2  # neither stream counted as a reply


def test_single_choice_stream_has_no_interleaving_finding(faultserver, tmp_path: Path) -> None:
    _, lines = run_one(faultserver, "plain_sse", tmp_path)
    assert all(line["other_index_chunks"] == 0 and "choices_interleaved" not in codes(line) for line in lines)
