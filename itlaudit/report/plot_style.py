"""The look every report PNG shares (run figures in plots.py, sweep figures in sweep_plots.py): size,
resolution, a colour per variant, red for "cut short" and "worse", log axes past a decade, and how a
factor is worded. matplotlib is configured here, once, before pyplot is imported."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI machines and servers; must precede pyplot

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "CROWDED",
    "DPI",
    "LOG_SPAN",
    "SAME_BAND",
    "TRUNCATION_RED",
    "WIDE",
    "Colour",
    "colour",
    "plt",
    "save_figure",
    "spans_decades",
    "speedup_words",
]

# Labels carry names from scenarios and run folders: `$...$` there is text, never mathtext (which fails
# on arbitrary input and would abort the report).
matplotlib.rcParams["text.parse_math"] = False

DPI = 100
WIDE = (11.0, 5.5)  # inches: 1100 × 550 px, legible in a browser at 100 % and in a PR comment
# A ratio of largest to smallest value beyond this spans more than a decade: log axis, or the small
# bars and the fast variant's curve collapse onto the axis.
LOG_SPAN = 10.0
TRUNCATION_RED = "#d62728"
# Beyond this many variants (e.g. two runs of K0/K3/K3-capped in one report) side-by-side panels and
# two-line bar labels collide: panels stack and labels shorten.
CROWDED = 3
SAME_BAND = 0.02  # within ±2 %: printing "1.00× better" would suggest a difference that is not there

Colour = tuple[float, float, float]
# tab10 without its red (index 3): red means "cut short" in the timeline and "worse" on the bars.
_PALETTE: list[Colour] = [
    (float(r), float(g), float(b))
    for i, (r, g, b, _) in enumerate(matplotlib.colormaps["tab10"](range(10)))
    if i != 3
]


def colour(index: int) -> Colour:
    """A variant's colour by its position: the same in every figure of a report or a sweep."""
    return _PALETTE[index % len(_PALETTE)]


def save_figure(fig: Figure, path: Path) -> Path:
    """Write the figure as a PNG at the reports' DPI and free it: pyplot keeps every open figure alive,
    and a sweep draws dozens."""
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return path


def spans_decades(values: np.ndarray) -> bool:
    """Whether the positive values' 1st to 99th percentile spans more than LOG_SPAN: then the axis is
    logarithmic, or the small values collapse onto it (percentiles, so one outlier does not decide)."""
    positive = values[values > 0]
    if positive.size < 2:
        return False
    low, high = np.percentile(positive, [1, 99])
    return bool(high / low > LOG_SPAN)


def speedup_words(factor: float, better: str = "better", worse: str = "worse") -> str:
    """A speedup factor in words ("1.52× better", "2.00× worse"), "≈ same" inside SAME_BAND."""
    if abs(factor - 1) < SAME_BAND:
        return "≈ same"
    return f"{factor:.2f}× {better}" if factor >= 1 else f"{1 / factor:.2f}× {worse}"
