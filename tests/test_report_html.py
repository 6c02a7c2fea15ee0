"""report.html: self-contained, every figure embedded, server strings escaped; headline sentences."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from reportkit import k0_k3, request_findings, sampled_window, spec_decode, stream

from itlaudit.analysis.derive import summarize_run
from itlaudit.model.codes import Finding, Severity
from itlaudit.report.html import inline_markdown, render_html
from itlaudit.report.markdown import escape, headline, table_cell
from itlaudit.report.plots import PLOTS
from itlaudit.report.writer import write_reports
from itlaudit.store.jsonl import RecordWriter
from itlaudit.workflows.derive import write_derived

PLANTED = "<script>alert(1)</script>"


def _run_dir(tmp_path: Path, records: list) -> Path:
    run = tmp_path / "run"
    with RecordWriter(run / "requests.jsonl") as writer:
        for record in records:
            writer.write(record.to_json())
    return run


def test_html_embeds_every_plot_and_fetches_nothing(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, k0_k3())
    compare = {  # an unversioned (previous-format) compare.json, as itlaudit wrote them
        "baseline": "K0",
        "variants": {"K0": {}, "K3": {"spec_decode": spec_decode([0.9, 0.8, 0.7])}},
        "findings": [],
    }
    (run / "compare.json").write_text(json.dumps(compare))
    sampled = [{"variant": "K3", **row} for row in sampled_window()]
    (run / "server_metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in sampled))
    write_derived(run, "demo")
    page = (run / "report.html").read_text()
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(PLOTS)
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert not re.search(r"(src|href)=\"(https?:|//)", page)
    assert "default-src 'none'" in page
    for name, _, _ in PLOTS:
        assert f"]({name})" in (run / "report.md").read_text()
    assert (run / "chunks.csv").is_file()


def test_planted_script_in_generated_text_and_names_is_escaped(tmp_path: Path) -> None:
    bad = stream(PLANTED, tokens=8, max_tokens=64, text=PLANTED)
    bad.error = PLANTED
    records = [bad, *k0_k3(3, capped=False)]
    summary = summarize_run(records)
    findings = request_findings(records)
    findings.append(Finding("x", Severity.ERROR, PLANTED, request_id=PLANTED))
    target = write_reports(tmp_path, PLANTED, records, summary, findings)
    page = target.read_text()
    assert "<script" not in page
    assert "&lt;script&gt;" in page


def test_foreign_text_reads_as_typed_in_both_reports() -> None:
    """No HTML entity in report.md's text for a `>` (it opens nothing), and the page shows `<`, `>` and
    `&` as typed, never "&lt;" in the reader's eyes (issue 36 item 6)."""
    said = "digit_ratio 0.5 > 0.35 & <b>"
    written = escape(said)
    assert written == "digit\\_ratio 0.5 > 0.35 &amp; &lt;b>"
    assert inline_markdown(written) == "digit\\_ratio 0.5 &gt; 0.35 &amp; &lt;b&gt;"


def test_headline_says_faster_per_token_though_chunk_itl_larger_and_calls_out_truncation() -> None:
    lines = headline(summarize_run(k0_k3()))
    assert lines[0].startswith("**K3 is 3.03× faster per token than K0**")
    assert ", though its chunk ITL is 1.30× larger" in lines[0]
    assert "(each chunk carries 3.9 tokens)" in lines[0]  # 63 decode tokens in 16 chunks
    assert lines[1] == (
        "**K3-capped vs K0: not comparable: 4 of 4 requests capped at 16 tokens** (completion tokens "
        "p50 16 vs 64 for K0): its speed is not ranked (see Findings)."
    )
    assert len(lines) == 2


def test_headline_renders_bold_in_html() -> None:
    page = render_html("t", summarize_run(k0_k3()), [])
    assert "<strong>K3 is 3.03× faster per token than K0</strong>" in page


def test_table_cell_keeps_itlaudit_markdown_but_not_pipes_or_lines() -> None:
    assert table_cell("speedup itl_ms.p50 | over\nK0") == "speedup itl_ms.p50 \\| over K0"


def test_two_runs_in_one_report_take_short_labels(tmp_path: Path) -> None:
    """`report A B --label base=A --label new=B`: the variants read base/K3, not the run folders'
    long names, in the title, the headline and the table."""
    from simkit import itlaudit

    runs = []
    for name in ("mtp-long-decode-20261204T030116Z", "mtp-long-decode-20261204T030209Z"):
        run = _run_dir(tmp_path / name, k0_k3(capped=False))
        runs.append(run)
    out = tmp_path / "both"
    done = itlaudit(
        "report",
        *map(str, runs),
        "--label",
        f"base={runs[0]}",
        "--label",
        f"new={runs[1]}/",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    text = (out / "report.md").read_text()
    assert text.startswith("# itlaudit: base vs new\n")
    assert "| metric | base/K0 | base/K3 | new/K0 | new/K3 |" in text
    assert "- **new/K0 is about as fast per token as base/K0**." in text
    wrong = itlaudit("report", *map(str, runs), "--label", f"x={tmp_path}")
    assert wrong.returncode == 2 and "is not one of the run folders given" in wrong.stderr
