"""Each figure on hand-built runs: a PNG of the fixed size, or None when there is nothing to draw."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest
from reportkit import k0_k3, stream, views

from itlaudit.model.records import STATUS_HTTP_ERROR
from itlaudit.report import plots
from itlaudit.report.plot_style import DPI, WIDE
from itlaudit.report.plots import (
    PLOTS,
    plot_acceptance,
    plot_timeline,
    speedup,
    write_plots,
)

SPEC = {"K3": {"per_position_acceptance": [0.9, 0.8, 0.7], "acceptance_length": 3.4}}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize(("name", "function"), [(n, f) for n, _, f in PLOTS], ids=[n for n, _, _ in PLOTS])
def test_each_plot_writes_a_png_of_the_fixed_size(tmp_path: Path, name: str, function) -> None:
    target = tmp_path / name
    assert function(views(k0_k3(), SPEC), target) == target
    assert target.stat().st_size > 10_000
    assert png_size(target) == (int(WIDE[0] * DPI), int(WIDE[1] * DPI) if name != "timeline.png" else 400)


@pytest.mark.parametrize("n", [1, 1000])
def test_one_request_and_a_thousand_both_draw(tmp_path: Path, n: int) -> None:
    records = [stream("K0", i, tokens=32, max_tokens=32, jitter=0.2) for i in range(n)]
    written = write_plots(views(records), tmp_path)
    assert {p.name for _, p in written} == {name for name, _, _ in PLOTS} - {"acceptance.png"}


def test_nothing_to_draw_gives_none_not_an_empty_panel(tmp_path: Path) -> None:
    failed = stream("K0")
    failed.status = STATUS_HTTP_ERROR
    assert plot_timeline(views([failed]), tmp_path / "t.png") is None
    assert plot_acceptance(views(k0_k3()), tmp_path / "a.png") is None  # no compare.json
    assert not (tmp_path / "a.png").exists()


def test_stale_png_of_an_absent_figure_is_removed(tmp_path: Path) -> None:
    (tmp_path / "acceptance.png").write_bytes(b"old")
    write_plots(views(k0_k3()), tmp_path)
    assert not (tmp_path / "acceptance.png").exists()


def test_truncated_requests_are_the_capped_ones() -> None:
    by_name = {v.name: v for v in views([stream("K3", tokens=16, max_tokens=64), stream("K0")])}
    assert by_name["K3"].truncated == {"K3-00000"}
    assert not by_name["K0"].truncated


def test_timeline_marks_what_the_findings_say_not_what_it_would_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full-length request that the given findings call cut short is drawn red; a capped one they
    do not name is not: the figure reads the findings, it never re-judges records."""
    drawn: list = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    whole, capped = stream("K0", 0), stream("K0", 1, tokens=16, max_tokens=64)
    view = replace(views([whole, capped])[0], truncated=frozenset({whole.request_id}))
    plot_timeline([view], tmp_path / "t.png")
    (ax,) = [a for a in drawn[0].axes if a.get_visible()]
    assert ax.get_title() == "K0: 2 requests, 1 cut short"
    red = [line for line in ax.get_lines() if line.get_color() == plots.TRUNCATION_RED]
    assert [int(line.get_ydata()[-1]) for line in red] == [64]


def test_speedup_direction() -> None:
    assert speedup(12.0, 4.0, lower_is_better=True) == 3.0
    assert speedup(80.0, 240.0, lower_is_better=False) == 3.0
    assert speedup(None, 4.0, lower_is_better=True) is None


def test_dollar_signs_in_a_variant_name_are_text_not_mathtext(tmp_path: Path) -> None:
    """A run folder from before names were validated (or a report over folders named so) still plots."""
    records = [replace(r, variant="K3 $\\frac{a}{b$" if r.variant == "K3" else r.variant) for r in k0_k3()]
    written = write_plots(views(records), tmp_path)
    assert written and all(p.stat().st_size > 0 for _, p in written)
