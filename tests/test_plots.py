"""Each figure on hand-built runs whose figures are known (tests/reportkit.py): the data on the axes —
bar heights, curve points, which lines are red — is what the streams imply, or None when there is
nothing to draw. The figures are caught as they are saved, so only the public plot functions are used."""

from __future__ import annotations

import itertools
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.colors import same_color
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from reportkit import block, k0_k3, spec_decode, stream, views

from itlaudit.model.records import Status
from itlaudit.report import plots
from itlaudit.report.plot_style import DPI, NEUTRAL_GREY, WIDE
from itlaudit.report.plots import (
    PLOTS,
    SERVER_TIMELINE_SIZE,
    plot_acceptance,
    plot_itl_cdf,
    plot_itl_headline,
    plot_latency_bars,
    plot_timeline,
    plot_tokens_per_chunk,
    speedup,
    write_plots,
)

SPEC = {"K3": spec_decode([0.9, 0.8, 0.7])}  # acceptance length 3.4
# What k0_k3() implies, worked by hand. K0: 64 tokens one per 10 ms step. K3: chunks of 1, 4×15, 3
# tokens 13 ms apart, so 63 tokens in 16 steps = 208 ms. K3-capped: chunks of 1, 4, 4, 4, 3 = 16 tokens
# in 4 steps = 52 ms.
K0_ITL, K3_ITL, CAPPED_ITL, STEP = 10.0, 208 / 63, 52 / 15, 13.0
RED = "#d62728"


@pytest.fixture()
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure saved while the test runs, kept after the plot function has closed it."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def only_figure(drawn: list[Figure]) -> Figure:
    assert len(drawn) == 1
    return drawn[0]


def heights(ax: Axes) -> list[float]:
    """Bar heights in x order."""
    bars = sorted((p for p in ax.patches if isinstance(p, Rectangle)), key=lambda bar: bar.get_x())
    return [bar.get_height() for bar in bars]


def curves(ax: Axes) -> dict[str, Line2D]:
    return {
        str(line.get_label()): line for line in ax.get_lines() if not str(line.get_label()).startswith("_")
    }


def request_lines(ax: Axes) -> list[Line2D]:
    """The per-request progress lines of a timeline panel (not the max_tokens rule)."""
    return [line for line in ax.get_lines() if np.asarray(line.get_xdata()).size > 2]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize(("name", "function"), [(n, f) for n, _, f in PLOTS], ids=[n for n, _, _ in PLOTS])
def test_each_plot_writes_a_png_of_the_fixed_size(tmp_path: Path, name: str, function) -> None:
    target = tmp_path / name
    assert function(views(k0_k3(), SPEC), target) == target
    heights = {"timeline.png": 400, "server_timeline.png": int(SERVER_TIMELINE_SIZE[1] * DPI)}
    assert png_size(target) == (int(WIDE[0] * DPI), heights.get(name, int(WIDE[1] * DPI)))


def test_headline_bars_are_token_and_chunk_itl_with_the_ratio_under_each_name(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    plot_itl_headline(views(k0_k3()), tmp_path / "h.png")
    (ax,) = only_figure(drawn).axes
    assert heights(ax) == pytest.approx([K0_ITL, K0_ITL, K3_ITL, STEP, CAPPED_ITL, STEP])
    labels = [label.get_text() for label in ax.get_xticklabels()]
    assert labels == [
        "K0\n(baseline)",
        f"K3\n{K0_ITL / K3_ITL:.2f}× faster per token",
        "K3-capped\nnot comparable: 4 of 4\nrequests capped at 16 tokens",
    ]
    assert [same_color(label.get_color(), RED) for label in ax.get_xticklabels()] == [False, False, True]


def test_cdf_curves_are_the_per_token_and_per_chunk_gaps(tmp_path: Path, drawn: list[Figure]) -> None:
    plot_itl_cdf(views(k0_k3(capped=False)), tmp_path / "c.png")
    (ax,) = only_figure(drawn).axes
    lines = curves(ax)
    assert set(lines) == {"K0 per token", "K0 per chunk (= per token)", "K3 per token", "K3 per chunk"}
    for line in lines.values():
        y = np.asarray(line.get_ydata())
        assert y[-1] == 1.0 and np.all(np.diff(y) > 0)  # a CDF: rises to every step
    # 4 requests × 63 gaps of 10 ms; K3: per token 13/4 ms in the 15 four-token chunks and 13/3 ms in
    # the last three-token one, per chunk 13 ms for all 16.
    assert np.asarray(lines["K0 per token"].get_xdata()).tolist() == [K0_ITL] * 252
    k3_token = np.asarray(lines["K3 per token"].get_xdata())
    assert k3_token == pytest.approx([STEP / 4] * 60 + [STEP / 3] * 4)
    assert np.asarray(lines["K3 per chunk"].get_xdata()) == pytest.approx([STEP] * 64)


def test_tokens_per_chunk_bars_are_the_share_of_chunks_of_each_size(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    plot_tokens_per_chunk(views(k0_k3()), tmp_path / "t.png")
    (ax,) = only_figure(drawn).axes
    shares = {str(c.get_label()): [bar.get_height() for bar in c] for c in ax.containers}
    # Per request K3 sends 17 chunks (1, 4×15, 3), K3-capped 5 (1, 4, 4, 4, 3); sizes 1…4 all shown.
    assert shares == {
        "K0 (mean 1.00 tokens/chunk)": pytest.approx([100.0, 0.0, 0.0, 0.0]),
        "K3 (mean 3.76 tokens/chunk)": pytest.approx([100 / 17, 0.0, 100 / 17, 1500 / 17]),
        "K3-capped (mean 3.20 tokens/chunk), not comparable": pytest.approx([20.0, 0.0, 20.0, 60.0]),
    }


def test_timeline_draws_each_request_and_the_capped_ones_red(tmp_path: Path, drawn: list[Figure]) -> None:
    plot_timeline(views(k0_k3()), tmp_path / "t.png")
    panels = {ax.get_title(): ax for ax in only_figure(drawn).axes if ax.get_visible()}
    assert set(panels) == {
        "K0: 4 requests",
        "K3: 4 requests",
        "K3-capped: 4 requests, 4 cut short\nnot comparable",
    }
    for title, ax in panels.items():
        lines = request_lines(ax)
        assert len(lines) == 4
        capped = "cut short" in title
        assert [np.asarray(line.get_ydata())[-1] for line in lines] == [16 if capped else 64] * 4
        assert all(same_color(line.get_color(), RED) == capped for line in lines)
    k0 = request_lines(panels["K0: 4 requests"])[0]
    # Starts at (0, 0), first token at the 40 ms TTFT, the last of 64 at 40 + 63 × 10 ms.
    assert np.asarray(k0.get_xdata())[[0, 1, -1]] == pytest.approx([0.0, 0.04, 0.67])
    assert np.asarray(k0.get_ydata())[[0, 1, -1]].tolist() == [0, 1, 64]


def test_latency_bars_are_the_percentiles_and_the_annotations_the_p50_ratio(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    plot_latency_bars(views(k0_k3()), tmp_path / "l.png")
    panels = {ax.get_title(): ax for ax in only_figure(drawn).axes}
    itl = panels["token ITL (ms)"]
    # p50, p90, p99 per variant: every request of a variant is alike, so the three are equal.
    assert heights(itl) == pytest.approx([K0_ITL] * 3 + [K3_ITL] * 3 + [CAPPED_ITL] * 3)
    # K3 is significantly faster (4 vs 4 requests, exact p 0.029); K3-capped is never ranked.
    assert [t.get_text() for t in itl.texts] == [f"{K0_ITL / K3_ITL:.2f}×\nbetter", "not\ncomparable"]
    assert heights(panels["TTFT (ms)"]) == pytest.approx([40.0] * 9)
    assert [t.get_text() for t in panels["TTFT (ms)"].texts] == ["≈ same", "not\ncomparable"]
    # Decode tokens/s per request: 63 tokens after the first over the decode time.
    rates = [63 / 0.63] * 3 + [63 / 0.208] * 3 + [15 / 0.052] * 3
    assert heights(panels["decode tokens/s per request"]) == pytest.approx(rates)


def test_acceptance_bars_are_the_per_position_rates(tmp_path: Path, drawn: list[Figure]) -> None:
    plot_acceptance(views(k0_k3(), SPEC), tmp_path / "a.png")
    (ax,) = only_figure(drawn).axes
    assert [c.get_label() for c in ax.containers] == ["K3 (acceptance length 3.40)"]
    bars = ax.containers[0]
    assert [bar.get_height() for bar in bars] == [0.9, 0.8, 0.7]
    assert [bar.get_x() + bar.get_width() / 2 for bar in bars] == pytest.approx([1, 2, 3])


def test_spec_decode_figures_cut_short_draw_no_acceptance_and_raise_nothing(tmp_path: Path) -> None:
    """compare.json is another command's file: a variant's spec_decode missing its counts is absent
    figures, as a compare.json cut short is, never a traceback out of the report."""
    cut = {"K3": {"per_position_acceptance": [0.9, 0.8, 0.7]}}
    drawn_views = views(k0_k3(), cut)
    assert all(v.spec_decode is None for v in drawn_views)
    assert plot_acceptance(drawn_views, tmp_path / "a.png") is None


@pytest.mark.parametrize("n", [1, 1000])
def test_one_request_and_a_thousand_both_draw(tmp_path: Path, n: int, drawn: list[Figure]) -> None:
    records = [stream("K0", i, tokens=32, max_tokens=32, jitter=0.2) for i in range(n)]
    written = write_plots(views(records), tmp_path)
    assert {p.name for _, p in written} == {name for name, _, _ in PLOTS} - {"acceptance.png"}
    cdf, timeline = drawn[1], drawn[4]  # in PLOTS order
    assert np.asarray(curves(cdf.axes[0])["K0 per token"].get_xdata()).size == 31 * n
    assert len(request_lines(timeline.axes[0])) == min(n, 20)  # a sample, evenly spread


def test_nothing_to_draw_gives_none_not_an_empty_panel(tmp_path: Path, drawn: list[Figure]) -> None:
    failed = stream("K0")
    failed.status = Status.HTTP_ERROR
    assert plot_timeline(views([failed]), tmp_path / "t.png") is None
    assert plot_acceptance(views(k0_k3()), tmp_path / "a.png") is None  # no compare.json
    assert not (tmp_path / "a.png").exists() and drawn == []


def test_figures_drawn_in_forked_processes_are_the_same_pngs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer draws with one process a core: every figure the same bytes as drawn in-process, in
    PLOTS order, one with nothing to draw (no compare.json: no acceptance) left out and its stale PNG
    removed. Three of the figures, inherited by the forked processes as patched here."""
    kept = {"itl_headline.png", "acceptance.png", "tokens_per_chunk.png"}
    monkeypatch.setattr(plots, "PLOTS", tuple(entry for entry in PLOTS if entry[0] in kept))
    drawn = views(k0_k3())
    for folder in ("here", "forked"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "acceptance.png").write_bytes(b"old")
    here = plots.write_plots(drawn, tmp_path / "here")
    forked = plots.write_plots(drawn, tmp_path / "forked", workers=3)
    assert (
        [path.name for _, path in forked]
        == [path.name for _, path in here]
        == [
            "itl_headline.png",
            "tokens_per_chunk.png",
        ]
    )
    assert [caption for caption, _ in forked] == [caption for caption, _ in here]
    assert [path.read_bytes() for _, path in forked] == [path.read_bytes() for _, path in here]
    assert not (tmp_path / "forked" / "acceptance.png").exists()


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
    assert ax.get_title() == "K0: 2 requests, 1 cut short\nnot comparable"
    red = [line for line in ax.get_lines() if line.get_color() == plots.TRUNCATION_RED]
    assert [int(line.get_ydata()[-1]) for line in red] == [64]


def test_speedup_direction() -> None:
    assert speedup(12.0, 4.0, lower_is_better=True) == 3.0
    assert speedup(80.0, 240.0, lower_is_better=False) == 3.0
    assert speedup(None, 4.0, lower_is_better=True) is None


def test_dollar_signs_in_a_variant_name_are_text_not_mathtext(tmp_path: Path, drawn: list[Figure]) -> None:
    """A run folder from before names were validated (or a report over folders named so) still plots."""
    name = "K3 $\\frac{a}{b$"
    records = [replace(r, variant=name if r.variant == "K3" else r.variant) for r in k0_k3()]
    written = write_plots(views(records), tmp_path)
    assert written and all(p.stat().st_size > 0 for _, p in written)
    headline = drawn[0].axes[0]
    assert headline.get_xticklabels()[1].get_text().split("\n")[0] == name


def test_headline_of_zero_itl_draws_without_a_singular_axis(tmp_path: Path) -> None:
    """One-token replies have token and chunk ITL 0: the axis must not collapse to [0, 0]."""
    import warnings

    from itlaudit.report.plots import VariantView, plot_itl_headline

    zero = block(itl_ms={"p50": 0.0}, chunk_itl_ms={"p50": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        views = [VariantView("A", [], zero), VariantView("B", [], zero)]
        drawn = plot_itl_headline(views, tmp_path / "h.png")
    assert drawn is not None and drawn.exists()


def drawn_renderer(fig: Figure) -> RendererAgg:
    """A renderer with the (closed) figure laid out on it, to measure where its texts landed."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def bars_of(ax: Axes, x: float) -> list[Rectangle]:
    """The bars of the group centred on tick x (one variant)."""
    return [
        p for p in ax.patches if isinstance(p, Rectangle) and abs(p.get_x() + p.get_width() / 2 - x) < 0.45
    ]


def is_grey(bar: Rectangle) -> bool:
    r, g, b, _ = bar.get_facecolor()
    return r == g == b


def test_a_not_comparable_variant_is_grey_and_crossed_out_in_every_bar_figure(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    """The demo's capped variant was green, labelled "2.87× faster": grey and hatched now, and no
    comparable variant is grey (the palette has no grey)."""
    plot_itl_headline(views(k0_k3()), tmp_path / "h.png")
    plot_latency_bars(views(k0_k3()), tmp_path / "l.png")
    axes = [drawn[0].axes[0], *drawn[1].axes]
    for ax in axes:
        for x, capped in ((0, False), (1, False), (2, True)):
            group = bars_of(ax, x)
            assert group and all(is_grey(bar) == capped for bar in group)
            assert all((bar.get_hatch() == "xx") == capped for bar in group)


def test_a_small_noisy_difference_is_no_verdict_not_worse(tmp_path: Path, drawn: list[Figure]) -> None:
    """TTFT 1.1× apart over 6 requests each, overlapping: the bars print no verdict (diff's rule
    says unknown), in grey, where they printed "1.11× worse" in red."""
    base = [stream("K0", i, ttft_ms=t) for i, t in enumerate((40, 48, 42, 46, 44, 50))]
    new = [stream("K3", i, ttft_ms=t) for i, t in enumerate((44, 52, 41, 50, 49, 55))]
    plot_latency_bars(views(base + new), tmp_path / "l.png")
    (words,) = {ax.get_title(): ax for ax in only_figure(drawn).axes}["TTFT (ms)"].texts
    assert words.get_text().startswith("no verdict\n(p ") and words.get_text().endswith("6\u00a0vs\u00a06)")
    assert same_color(words.get_color(), NEUTRAL_GREY)


def test_an_invalid_baseline_makes_every_comparison_not_comparable(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    records = [stream("K0", i, tokens=16) for i in range(4)] + [
        stream("K3", i, per_chunk=4) for i in range(4)
    ]
    plot_itl_headline(views(records), tmp_path / "h.png")
    labels = [label.get_text() for label in only_figure(drawn).axes[0].get_xticklabels()]
    assert labels[0].startswith("K0\n(baseline)\nnot comparable: 4 of 4")
    assert labels[1].replace("\n", " ").startswith("K3 not comparable: base K0: 4 of 4 requests capped")
    assert "faster" not in labels[1]


def test_cdf_axis_is_clipped_at_a_high_percentile_when_one_step_stretches_it(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    records = [stream("K0", i) for i in range(4)]
    stalled = records[0].chunks
    stalled.t_ms = [t + (300.0 if k > 30 else 0.0) for k, t in enumerate(stalled.t_ms)]  # one 310 ms gap
    plot_itl_cdf(views(records), tmp_path / "c.png")
    (ax,) = only_figure(drawn).axes
    assert ax.get_xlim()[1] == pytest.approx(K0_ITL * 1.05)
    # The stall is one step per token and one per chunk: 2 of the 2 × 252 steps drawn.
    assert "axis clipped at the 99.5th percentile (10.0 ms): 2 of 504 steps lie beyond, up to 310.0 ms" in (
        ax.get_xlabel()
    )
    plot_itl_cdf(views([stream("K0", i) for i in range(4)]), tmp_path / "d.png")
    assert "clipped" not in drawn[1].axes[0].get_xlabel()


def test_cdf_legend_sits_below_the_curves(tmp_path: Path, drawn: list[Figure]) -> None:
    plot_itl_cdf(views(k0_k3()), tmp_path / "c.png")
    fig = only_figure(drawn)
    renderer = drawn_renderer(fig)
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.y1 < ax.get_window_extent(renderer).y0
    assert "(not comparable)" in "".join(t.get_text() for t in ax.get_legend().get_texts())


def test_long_run_folder_names_of_a_multi_run_report_do_not_overlap(
    tmp_path: Path, drawn: list[Figure]
) -> None:
    """`itlaudit report RUN_A RUN_B` names variants "<run folder>/<variant>": six of them side by side
    overlapped into one strip; broken onto lines, each label stays inside its own slot."""
    runs = ("mtp-long-decode-20261204T030116Z", "mtp-long-decode-20261204T030209Z")
    records = [replace(r, variant=f"{run}/{r.variant}") for run in runs for r in k0_k3()]
    plot_itl_headline(views(records), tmp_path / "h.png")
    plot_latency_bars(views(records), tmp_path / "l.png")
    for fig in drawn:
        renderer = drawn_renderer(fig)
        for ax in fig.axes:
            boxes = [
                t.get_window_extent(renderer)
                for t in ax.get_xticklabels()
                if t.get_visible() and t.get_text()
            ]
            assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes)), ax.get_title()
