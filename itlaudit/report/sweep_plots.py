"""PNG figures of a load sweep (sweep.json in, PNGs out), in plots.py's style: one question each,
a variant keeps its colour in every figure, the first variant is the baseline of every ratio.
Error bars are the [min, max] over a point's trials when it had several; under `--trials auto` the token
ITL figure also draws each point's 95% interval of the mean (the rule its trials stopped on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from itlaudit.analysis.sweep import LatencyFigure, Scalar, SweepPoint, SweepResult, latency_of, load_of
from itlaudit.analysis.validity import NOT_COMPARABLE
from itlaudit.model.vocabulary import LoadAxis
from itlaudit.report.plot_style import DPI, LOG_SPAN, NEUTRAL_GREY, WIDE, colour, plt, save_figure


def _finish(
    fig: Figure, ax: Axes, path: Path, *, xlabel: str, ylabel: str, title: str, columns: int = 1
) -> Path:
    """Every sweep figure's labels, grid and legend the same way, then the file."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=columns)
    fig.tight_layout()
    return save_figure(fig, path)


def _load_label(axis: LoadAxis) -> str:
    return "concurrency (streams)" if axis == LoadAxis.CONCURRENCY else "request rate (requests/s)"


def _column(values: Iterable[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _values(points: Sequence[SweepPoint], figure: LatencyFigure, pct: str) -> np.ndarray:
    """Each point's `pct` of a latency figure (nan where it has none)."""
    return _column(latency_of(p, figure).get(pct) for p in points)


def _scalars(points: Sequence[SweepPoint], key: Scalar) -> np.ndarray:
    return _column(p.get(key) for p in points)


def _loads(points: Sequence[SweepPoint], axis: LoadAxis) -> np.ndarray:
    return _column(load_of(p, axis) for p in points)


def _error(points: Sequence[SweepPoint], key: str, centre: np.ndarray) -> np.ndarray | None:
    """Distances from the plotted median to the trials' min and max, or None without trials."""
    bands = [(p.get("spread") or {}).get(key) for p in points]
    if not any(bands):
        return None
    low = [c - b[0] if b else 0.0 for c, b in zip(centre, bands, strict=True)]
    high = [b[1] - c if b else 0.0 for c, b in zip(centre, bands, strict=True)]
    return np.array([low, high])


def _draw_intervals(ax: Axes, x: np.ndarray, points: Sequence[SweepPoint], line: Any, name: str) -> None:
    """--trials auto: each point's bootstrap interval of the mean p50 token ITL (sweep.json's
    `convergence`), beside the median of its trials; nothing for points without one."""
    found = [(stopped.get("interval") if (stopped := p.get("convergence")) else None) or None for p in points]
    kept = [
        (xi, i) for xi, i in zip(x, found, strict=True) if isinstance(i, dict) and i.get("mean") is not None
    ]
    if not kept:
        return
    mean = np.array([i["mean"] for _, i in kept], dtype=float)
    low = np.array([i["low"] for _, i in kept], dtype=float)
    high = np.array([i["high"] for _, i in kept], dtype=float)
    ax.errorbar(
        [xi for xi, _ in kept],
        mean,
        yerr=np.array([mean - low, high - mean]).clip(min=0),
        color=line,
        marker="s",
        markersize=4,
        linestyle="none",
        capsize=5,
        label=f"{name} token ITL p50, 95% CI of the mean",
    )


def _log_if_wide(ax: Axes, values: np.ndarray, ticks: bool = False) -> None:
    """Log x past a decade, labelled in plain numbers (labels are never mathtext here); `ticks` puts
    one at each load of the grid."""
    kept = values[np.isfinite(values) & (values > 0)]
    if kept.size and kept.max() / kept.min() >= LOG_SPAN:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if ticks:
        ax.set_xticks(sorted(set(kept.tolist())))


def plot_itl_vs_throughput(sweep: SweepResult, path: Path) -> Path | None:
    """Token ITL p50 and p99 against output tokens/s: the latency a user pays for the throughput the
    server gives; chunk ITL p50 dashed beside it, which is what a chunk-counting tool would draw."""
    series = sweep.variants
    if not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=WIDE, dpi=DPI)
    xs_all = []
    for index, (name, points) in enumerate(series.items()):
        if not points:
            continue
        x = _scalars(points, "output_tokens_per_s")
        xs_all.append(x)
        p50 = _values(points, "itl_ms", "p50")
        ax.errorbar(
            x,
            p50,
            yerr=_error(points, "itl_ms.p50", p50),
            color=colour(index),
            marker="o",
            label=f"{name} token ITL p50",
            capsize=3,
        )
        _draw_intervals(ax, x, points, colour(index), name)
        ax.plot(
            x,
            _values(points, "itl_ms", "p99"),
            color=colour(index),
            marker="^",
            linewidth=0.8,
            label=f"{name} token ITL p99",
        )
        ax.plot(
            x,
            _values(points, "chunk_itl_ms", "p50"),
            color=colour(index),
            linestyle="--",
            marker="x",
            label=f"{name} chunk ITL p50",
        )
    _log_if_wide(ax, np.concatenate(xs_all))
    return _finish(
        fig,
        ax,
        path,
        xlabel="output tokens/s (all streams)",
        ylabel="inter-token latency (ms)",
        title="Token ITL against throughput (dashed: chunk ITL, what chunk-counting tools report)",
        columns=2,
    )


def plot_ttft_vs_load(sweep: SweepResult, path: Path) -> Path | None:
    """TTFT p50 and p99 against the load: where requests start to queue."""
    series = sweep.variants
    axis = sweep.axis
    if not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=WIDE, dpi=DPI)
    for index, (name, points) in enumerate(series.items()):
        if not points:
            continue
        x = _loads(points, axis)
        p50 = _values(points, "ttft_ms", "p50")
        ax.errorbar(
            x,
            p50,
            yerr=_error(points, "ttft_ms.p50", p50),
            color=colour(index),
            marker="o",
            label=f"{name} TTFT p50",
            capsize=3,
        )
        ax.plot(
            x,
            _values(points, "ttft_ms", "p99"),
            color=colour(index),
            marker="^",
            linestyle=":",
            label=f"{name} TTFT p99",
        )
    _log_if_wide(ax, np.array(sweep.grid, dtype=float), ticks=True)
    return _finish(
        fig, ax, path, xlabel=_load_label(axis), ylabel="time to first token (ms)", title="TTFT against load"
    )


def plot_speedup_vs_load(sweep: SweepResult, path: Path) -> Path | None:
    """Per-token speedup of each variant over the first (token ITL p50 ratio) against load, with the
    crossover — the load where it stops paying off — marked between the two points that bracket it.
    A load where either point is not comparable (analysis.validity) has no speedup: a grey cross at 1
    marks it, and the line breaks there."""
    crossovers = sweep.crossovers
    if not crossovers:
        return None
    series = sweep.variants
    axis = sweep.axis
    names = list(series)
    fig, ax = plt.subplots(figsize=WIDE, dpi=DPI)
    for found in crossovers:
        base = {load_of(p, axis): p for p in series[found.base]}
        pairs = [(p, base[load]) for p in series[found.variant] if (load := load_of(p, axis)) in base]
        x = np.array([load_of(p, axis) for p, _ in pairs], dtype=float)
        unlike = np.array([bool(p.get("not_comparable") or b.get("not_comparable")) for p, b in pairs])
        y = np.array(
            [_speedup(p, b) if not bad else np.nan for (p, b), bad in zip(pairs, unlike, strict=True)]
        )
        if unlike.any():
            ax.plot(
                x[unlike],
                np.ones(int(unlike.sum())),
                "x",
                color=NEUTRAL_GREY,
                markersize=10,
                mew=2,
                label=f"{found.variant}: {NOT_COMPARABLE}",
            )
        ax.plot(
            x,
            y,
            color=colour(names.index(found.variant)),
            marker="o",
            label=f"{found.variant} over {found.base}",
        )
        if found.last_faster is not None and found.first_slower is not None:
            where = float(np.sqrt(found.last_faster * found.first_slower))
            ax.axvline(where, color="#d62728", linestyle="--", linewidth=1)
            ax.annotate(
                f"crossover: {found.variant} slower past {found.last_faster:g}",
                (where, 1.0),
                textcoords="offset points",
                xytext=(6, 12),
                color="#d62728",
                fontsize=9,
            )
    ax.axhline(1.0, color="#555", linewidth=0.8)
    _log_if_wide(ax, np.array(sweep.grid, dtype=float), ticks=True)
    return _finish(
        fig,
        ax,
        path,
        xlabel=_load_label(axis),
        ylabel="per-token speedup (× faster, token ITL p50)",
        title="Per-token speedup over the baseline against load (above 1: faster)",
    )


def plot_itl_by_setting(sweep: SweepResult, path: Path) -> Path | None:
    """A `--serve-param` sweep's answer drawn: token ITL p50 per server setting (x, in the order
    swept: K0, K1, K3), one line per load, so "which K at which load" is where each line is lowest.
    A point that is not comparable is a grey cross, never part of a line."""
    if not sweep.settings:
        return None
    axis = sweep.axis
    names = [n for n in sweep.settings if sweep.variants.get(n)]
    if not names:
        return None
    labels = [n.removeprefix(f"{sweep.settings[n]['variant']}-") for n in names]
    fig, ax = plt.subplots(figsize=WIDE, dpi=DPI)
    for index, load in enumerate(sweep.grid):
        at = [next((p for p in sweep.variants[n] if load_of(p, axis) == load), None) for n in names]
        measured = np.array([_itl_or_nan(p) for p in at])
        bad = np.array([bool(p and p.get("not_comparable")) for p in at])
        x = np.arange(len(names))
        label = f"{_load_label(axis)} {load:g}"
        ax.plot(x, np.where(bad, np.nan, measured), color=colour(index), marker="o", label=label)
        if bad.any():
            ax.plot(x[bad], measured[bad], "x", color=NEUTRAL_GREY, markersize=10, mew=2)
        best = next((b.by_itl for b in sweep.best or [] if b.load == load and b.by_itl in names), None)
        if best is not None:  # the answer at this load, starred
            at_best = names.index(best)
            ax.plot([at_best], [measured[at_best]], "*", color=colour(index), markersize=16)
    ax.set_xticks(range(len(names)), labels, rotation=30 if len(names) > 6 else 0)
    return _finish(
        fig,
        ax,
        path,
        xlabel="server setting",
        ylabel="token ITL p50 (ms)",
        title="Token ITL per server setting, one line per load (lowest: the best setting there)",
    )


def _speedup(point: SweepPoint, base: SweepPoint) -> float:
    """The base's token ITL p50 over the point's; nan where either has none (every reply in one
    read): no speedup there."""
    mine, theirs = latency_of(point, "itl_ms").get("p50"), latency_of(base, "itl_ms").get("p50")
    return theirs / mine if mine and theirs else float("nan")


def _itl_or_nan(point: SweepPoint | None) -> float:
    if point is None:
        return float("nan")
    value = latency_of(point, "itl_ms").get("p50")
    return float(value) if isinstance(value, int | float) else float("nan")


def write_sweep_plots(sweep: SweepResult, out_dir: Path) -> list[tuple[str, Path]]:
    drawn = [
        (
            "Token ITL per server setting, one line per load",
            plot_itl_by_setting(sweep, out_dir / "sweep_itl_by_setting.png"),
        ),
        (
            "Token ITL against output tokens/s (dashed: chunk ITL)",
            plot_itl_vs_throughput(sweep, out_dir / "sweep_itl_vs_throughput.png"),
        ),
        ("TTFT against load", plot_ttft_vs_load(sweep, out_dir / "sweep_ttft_vs_load.png")),
        (
            "Per-token speedup against load, crossover marked",
            plot_speedup_vs_load(sweep, out_dir / "sweep_speedup_vs_load.png"),
        ),
    ]
    return [(caption, path) for caption, path in drawn if path is not None]
