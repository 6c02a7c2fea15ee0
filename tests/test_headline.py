"""The demo's capped variant is never called faster or better: one real `itlaudit demo` (K0, K3 and
a K3 capped at 128 tokens, on the simulator), then every output read as a user reads it: the
terminal, report.md, report.html's text, summary.json, and the data each figure drew (labels,
colours, hatches). vLLM #47297's trap was a cap read as a speed change; the auditor must not commit
it in any format."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import same_color, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from reportkit import block

from itlaudit.analysis.summary import RunSummary
from itlaudit.model.codes import Finding
from itlaudit.report.plot_style import INVALID_HATCH, TRUNCATION_RED
from itlaudit.report.plots import write_plots
from itlaudit.report.writer import variant_views
from itlaudit.store.jsonl import load_records

CAPPED = "K3-capped"
PRAISE = re.compile(r"faster|better", re.IGNORECASE)
NOT_COMPARABLE = "not comparable: 6 of 6 requests capped at 128 tokens"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One demo run (~30 s on the simulator) for every test here: its folder and its terminal output,
    from a real process without a terminal (a CI log)."""
    out = tmp_path_factory.mktemp("demo") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "itlaudit", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out, done.stdout + done.stderr


def praising_the_capped(text: str) -> list[str]:
    """The lines (or sentences) that name the capped variant and call something faster or better."""
    return [line for line in re.split(r"\n|</li>|</tr>", text) if CAPPED in line and PRAISE.search(line)]


def test_the_terminal_never_praises_the_capped_variant(demo: tuple[Path, str]) -> None:
    _, terminal = demo
    assert CAPPED in terminal
    assert praising_the_capped(terminal) == []


def test_report_md_says_not_comparable_where_the_speedup_would_be(demo: tuple[Path, str]) -> None:
    run, _ = demo
    text = (run / "report.md").read_text()
    assert praising_the_capped(text) == []
    bullets = [line for line in text.splitlines() if line.startswith("- **")]
    assert any(line.startswith("- **K3 is ") and "faster per token than K0" in line for line in bullets)
    (capped,) = [line for line in bullets if CAPPED in line]
    assert capped.startswith(f"- **K3-capped vs K0: {NOT_COMPARABLE}**")
    assert f"| comparable | yes | yes | no: {NOT_COMPARABLE.removeprefix('not comparable: ')} |" in text
    # The findings come before the five figures, and the shared cause is counted once.
    assert text.index("## Findings") < text.index("![")
    assert "**truncated_below_max_tokens** + **min_tokens_violated** (error) × 6 requests" in text


def test_report_html_text_never_praises_the_capped_variant(demo: tuple[Path, str]) -> None:
    run, _ = demo
    page = (run / "report.html").read_text()
    text = html.unescape(re.sub(r"<(?!/li>|/tr>)[^>]+>", "", page))
    assert praising_the_capped(text) == []
    assert f"K3-capped vs K0: {NOT_COMPARABLE}" in text


def test_summary_json_never_praises_the_capped_variant(demo: tuple[Path, str]) -> None:
    run, _ = demo
    summary = json.loads((run / "summary.json").read_text())
    assert not PRAISE.search(json.dumps(summary["variants"][CAPPED]))


@pytest.fixture(scope="module")
def drawn(demo: tuple[Path, str]) -> dict[str, Figure]:
    """The demo's figures drawn again from its run folder by the functions that drew its PNGs, caught
    as they are saved, by file name."""
    run, _ = demo
    summary = RunSummary.from_json(json.loads((run / "summary.json").read_text()), run / "summary.json")
    derived = [json.loads(line) for line in (run / "derived.jsonl").read_text().splitlines()]
    details = [f for line in derived for f in line["finding_details"]] + summary.run_findings
    findings = [Finding.from_json(f) for f in details]
    views = variant_views(load_records(run / "requests.jsonl"), summary, None, findings)
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        save(self, *args, **kwargs)

    (run / "redrawn").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", keep)
        written = write_plots(views, run / "redrawn")
    names = [path.name for _, path in written]
    assert names == [
        "itl_headline.png",
        "itl_cdf.png",
        "latency_bars.png",
        "tokens_per_chunk.png",
        "timeline.png",
    ]
    return dict(zip(names, figures, strict=True))


def capped_bars(fig: Figure) -> list[Rectangle]:
    """The bars of the capped variant (third group) on every panel."""
    return [
        p
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and 1.55 < p.get_x() + p.get_width() / 2 < 2.45
    ]


def test_every_figure_marks_the_capped_variant_and_praises_nothing(drawn: dict[str, Figure]) -> None:
    for fig in drawn.values():
        for ax in fig.axes:
            words = [t.get_text() for t in [*ax.texts, *ax.get_xticklabels()]]
            legend = ax.get_legend()
            words += [t.get_text() for t in legend.get_texts()] if legend else []
            assert praising_the_capped("\n".join(w.replace("\n", " ") for w in words)) == []


def test_headline_figure_labels_the_capped_bars_not_comparable_in_red(drawn: dict[str, Figure]) -> None:
    fig = drawn["itl_headline.png"]
    labels = fig.axes[0].get_xticklabels()
    capped = labels[2]
    assert capped.get_text().replace("\n", " ") == f"K3-capped {NOT_COMPARABLE}"
    assert same_color(capped.get_color(), TRUNCATION_RED)
    assert "faster per token" in labels[1].get_text()
    bars = capped_bars(fig)
    assert len(bars) == 2 and all(bar.get_hatch() == INVALID_HATCH for bar in bars)
    assert all(len(set(to_rgb(bar.get_facecolor()))) == 1 for bar in bars)  # grey: r == g == b


def test_latency_bars_say_not_comparable_over_the_capped_group(drawn: dict[str, Figure]) -> None:
    fig = drawn["latency_bars.png"]
    for ax in fig.axes:
        assert [t.get_text() for t in ax.texts][-1] == "not\ncomparable"
    bars = capped_bars(fig)
    assert len(bars) == 9 and all(bar.get_hatch() == INVALID_HATCH for bar in bars)
    assert all(len(set(to_rgb(bar.get_facecolor()))) == 1 for bar in bars)


def test_cdf_and_timeline_name_the_capped_variant_not_comparable(drawn: dict[str, Figure]) -> None:
    cdf = drawn["itl_cdf.png"].axes[0]
    capped = [t.get_text() for t in cdf.get_legend().get_texts() if CAPPED in t.get_text()]
    assert capped and all(t.endswith("(not comparable)") for t in capped)
    timeline = [
        ax.get_title() for fig in drawn.values() for ax in fig.axes if ax.get_title().startswith(CAPPED)
    ]
    assert timeline == ["K3-capped: 6 requests, 6 cut short\nnot comparable"]


def test_a_zero_p50_makes_no_factor_and_no_crash() -> None:
    """A variant whose token or chunk ITL p50 came out 0 ms (seen once in CI on an overloaded box) gets
    no "faster/slower" factor from it: before, 1 / 0 was a ZeroDivisionError traceback out of compare."""
    from itlaudit.report.markdown import comparison_sentence

    base = block(itl_ms={"p50": 2.0}, chunk_itl_ms={"p50": 2.0})
    zero_token = block(itl_ms={"p50": 0.0}, chunk_itl_ms={"p50": 8.0})
    assert comparison_sentence("K3", "K0", base, zero_token) is None
    sentence = comparison_sentence("K3", "K0", base, block(itl_ms={"p50": 1.0}, chunk_itl_ms={"p50": 0.0}))
    assert sentence == "**K3 is 2.00× faster per token than K0**."
