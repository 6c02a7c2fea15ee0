"""The look every report PNG shares (run figures in plots.py, sweep figures in sweep_plots.py): size,
resolution, a colour per variant, red for "cut short" and "worse", grey and hatching for a variant
that is not comparable (analysis.validity), log axes past a decade, how a factor and a verdict are
worded, and how long names are broken onto lines. matplotlib is configured here, once, before pyplot
is imported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI machines and servers; must precede pyplot

import matplotlib.pyplot as pyplot
import numpy as np
from matplotlib.figure import Figure

from itlaudit.analysis.stats import SAME_BAND, Comparison
from itlaudit.analysis.validity import Validity
from itlaudit.model.vocabulary import Shift

# pyplot as the report's figures use it, configured above (Agg): plots.py and sweep_plots.py take it here.
plt = pyplot

# Labels carry names from scenarios and run folders: `$...$` there is text, never mathtext (which fails
# on arbitrary input and would abort the report).
matplotlib.rcParams["text.parse_math"] = False

DPI = 100
WIDE = (11.0, 5.5)  # inches: 1100 × 550 px, legible in a browser at 100 % and in a PR comment
# A ratio of largest to smallest value beyond this spans more than a decade: log axis, or the small
# bars and the fast variant's curve collapse onto the axis.
LOG_SPAN = 10.0
TRUNCATION_RED = "#d62728"
BETTER_GREEN = "#2ca02c"  # only ever beside a significant "better"; never a not-comparable variant's colour
NEUTRAL_GREY = "#7f7f7f"  # "≈ same", "no verdict": words that rank nothing
INVALID_HATCH = "xx"  # a not-comparable variant's bars: crossed out, in grey
NO_VERDICT = "no verdict"  # a ratio the significance rule does not back
# Beyond this many variants (e.g. two runs of K0/K3/K3-capped in one report) side-by-side panels and
# two-line bar labels collide: panels stack and labels shorten.
CROWDED = 3
# A tick label's line length in characters: at 9 pt, six variants of this width fit the 11-inch figure
# side by side; a longer name (a run folder, "<run>/<variant>") is broken at '/', '-' or spaces.
TICK_WIDTH = 18

Colour = tuple[float, float, float]
# tab10 without its red (index 3: "cut short", "worse") and its grey (index 7: "not comparable").
_PALETTE: list[Colour] = [
    (float(r), float(g), float(b))
    for i, (r, g, b, _) in enumerate(matplotlib.colormaps["tab10"](range(10)))
    if i not in (3, 7)
]
# Greys for variants that are not comparable: distinct from each other, none reads as "good".
_INVALID_GREYS: list[Colour] = [(g, g, g) for g in (0.5, 0.68, 0.35, 0.6, 0.42)]


def colour(index: int) -> Colour:
    """A variant's colour by its position: the same in every figure of a report or a sweep."""
    return _PALETTE[index % len(_PALETTE)]


def variant_colour(index: int, validity: Validity) -> Colour:
    """colour(index), or a grey when the variant is not comparable: its bars and curves must not wear
    a colour (the demo's capped variant was green) that reads as a healthy result."""
    return colour(index) if validity.comparable else _INVALID_GREYS[index % len(_INVALID_GREYS)]


def tick_label(name: str, width: int = TICK_WIDTH) -> str:
    """A variant name on lines of at most `width` characters, broken after '/' (a report over several
    runs names variants "<run folder>/<variant>"), '-' or a space: long names side by side overlap."""
    lines = []
    for part in name.replace("/", "/\n").split("\n"):
        lines += textwrap.wrap(part, width, break_on_hyphens=True) or [part]
    return "\n".join(lines)


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


def verdict_words(
    comparison: Comparison, factor: float | None, better: str = "better", worse: str = "worse"
) -> tuple[str, str]:
    """(words, colour) for a figure's ratio: the factor in words only when stats.compare_samples (the
    rule diff uses) calls it significant and beyond its threshold; "≈ same" when it calls it the same;
    otherwise "no verdict" with the sample sizes and p, in grey. A 1.11× TTFT over 6 requests on a busy
    host is noise, and a figure must not print it as a verdict."""
    if comparison.verdict in (Shift.BETTER, Shift.WORSE) and factor is not None:
        words = speedup_words(factor, better, worse)
        return words, BETTER_GREEN if comparison.verdict == Shift.BETTER else TRUNCATION_RED
    if comparison.verdict == Shift.SAME:
        return "≈ same", NEUTRAL_GREY
    sizes = f"{comparison.n_base}\u00a0vs\u00a0{comparison.n_new}"  # no-break spaces: kept on one line
    if comparison.p_value is None:
        return f"{NO_VERDICT} ({sizes} requests)", NEUTRAL_GREY
    return f"{NO_VERDICT} (p {comparison.p_value:.2g}; {sizes})", NEUTRAL_GREY
