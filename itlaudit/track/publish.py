"""`itlaudit track publish OUT/`: the history as a static site a person opens from disk.

Why a site rather than `check`'s lines: a person believes a change when they see the series move, see
which builds were not measurements at all (a cap, failed requests) and can open the requests of the
build it names. The site is plain files: index.html (one row per fingerprint: sparkline, latest
build, status, and every open change), one page per fingerprint family (K0 and K3 of one experiment
side by side, since their speedup is one of the series), plotly.min.js copied from the plotly
package (no network: nothing is fetched when a page opens, from disk or from any web server) and
itlaudit's dashboard.js/.css (itlaudit/data/).

The figures are plotly.js figures written here as plain data; dashboard.js draws them and opens a
panel on a click: a point's build, commit link and per-request distribution (its raw samples beside
the previous point's), or a change's evidence and bisect result. Invalid points are never drawn as
values: the series break there, the builds are shaded in their class's colour, and the validity lane
at the top marks each one with its reason.

Nothing in the history is trusted (a shared PostgreSQL history is written by anyone who can reach
it): every string reaches the page escaped, in its HTML, in the JSON the page carries (no `<` can close
its script element or open a comment) and in what plotly draws as text; a link from the history is
drawn only when it is http or https, and one that is dropped is said so on the page.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, TypedDict
from urllib.parse import urlsplit

from itlaudit.analysis.changes import (
    BASE_VARIANT,
    CLIENT,
    CORRECTNESS,
    LENGTH,
    LENGTH_CAP,
    LENGTH_CHANGED,
    METHOD,
    SERIES,
    SERVER,
    SPEED,
    SPEEDUP,
    SPEEDUP_CLASS,
    SUSPECTED,
    VALID,
    Change,
    ChangeJSON,
    Point,
    Samples,
    SeriesSpec,
    open_changes,
)
from itlaudit.errors import TrackError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.track.db import BisectRecord, History, damaged

ASSETS = Path(__file__).resolve().parent.parent / "data"
MANIFEST = "dashboard.json"  # what a publish wrote: a later publish into the same folder replaces it
DEFAULT_GITHUB_REPO = "vllm-project/vllm"  # as `itlaudit bisect --github-repo`
# One colour per change class, used for the change lines, their markers and the invalid builds' shading.
CLASS_COLOURS = {
    LENGTH_CAP: "#f57c00",
    CORRECTNESS: "#6d4c41",
    CLIENT: "#607d8b",
    METHOD: "#1e88e5",
    SPEEDUP_CLASS: "#8e24aa",
    SPEED: "#e53935",
    LENGTH_CHANGED: "#c0a000",
    SERVER: "#00897b",
}
_INVALID_CLASS = {LENGTH: LENGTH_CAP, CORRECTNESS: CORRECTNESS, CLIENT: CLIENT}
_UNITS = {
    "itl_p50": "ms",
    "itl_p90": "ms",
    "tpot": "ms",
    "ttft": "ms",
    "throughput": "tokens/s",
    "output_len": "tokens",
    "acceptance": "tokens/chunk",
    "speedup": "×",
    "kv_usage_p50": "fraction",
    "kv_usage_max": "fraction",
    "server_acceptance": "tokens/step",
    "gpu_sm_clock": "MHz",
    "gpu_power_max": "W",
}
_VARIANT_COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#17becf", "#9467bd", "#bcbd22", "#e377c2")
_SVG_LIMIT = 3000  # points a trace draws as SVG; past it WebGL (a 10,000-build series stays responsive)
_SHA = re.compile(r"[0-9a-fA-F]{7,40}")
_FAMILY = re.compile(r"[0-9a-f]{16}")  # db.digest's: a family names a page's file, so only this is taken


class Line(TypedDict, total=False):
    color: str
    width: float
    dash: str


class Marker(TypedDict, total=False):
    size: int
    symbol: str | list[str]
    color: str | list[str]
    line: Line


class TraceMeta(TypedDict, total=False):
    """What dashboard.js reads off a clicked trace: what it is, its series, variant and sample."""

    kind: str
    series: str
    variant: str
    sample: str


class Trace(TypedDict, total=False):
    """A plotly.js scatter trace, as the page's JSON carries it to dashboard.js."""

    type: str
    mode: str
    x: Sequence[int | None]
    y: Sequence[float | None] | Sequence[str]
    yaxis: str
    name: str
    legendgroup: str
    showlegend: bool
    line: Line
    marker: Marker
    customdata: Sequence[int | None]
    text: Sequence[str | None]
    hovertemplate: str
    meta: TraceMeta


class Shape(TypedDict, total=False):
    """A plotly.js layout shape: a change's line or an invalid run's shaded band."""

    type: str
    xref: str
    yref: str
    x0: float
    x1: float
    y0: float
    y1: float
    line: Line
    fillcolor: str
    opacity: float
    layer: str


class Figure(TypedDict):
    """A plotly.js figure. Its layout stays open: plotly names each extra y axis as a key of its own
    (`yaxis2`, `yaxis3`, ...), one per row the page draws."""

    data: list[Trace]
    layout: Mapping[str, object]
    config: dict[str, bool]


class PointJSON(TypedDict):
    """A point as the panel shows it."""

    id: int
    variant: str
    order: int
    build: str
    commit: str | None
    commit_url: str | None
    flavour: str | None
    run_dir: str | None
    requests: int | None
    errors: int | None
    validity: str
    reason: str | None
    values: dict[str, float | None]


class ChangeRow(ChangeJSON):
    """A change as `check --json` gives it, with its bisection as the page shows it."""

    bisect: str | None
    culprit_url: str | None
    compare_url: str | None
    bisect_dir: str | None
    colour: str
    dropped: list[str]  # the links of its bisection that are not http(s), as the page says


class PageData(TypedDict):
    """What a fingerprint page's panels read."""

    family: str
    base: str
    points: dict[int, PointJSON]
    samples: dict[int, dict[str, list[float | None]]]
    changes: list[ChangeRow]
    labels: dict[str, str]


@dataclass(frozen=True)
class Published:
    """What a publish wrote: the index and how many fingerprint pages."""

    index: Path
    pages: int
    changes: int


@dataclass(frozen=True)
class _Build:
    """A point's build beyond what `History.points()` carries: for the panel and the commit link."""

    commit: str | None
    flavour: str | None
    run_dir: str | None
    requests: int
    errors: int


def _link(url: object) -> tuple[str | None, str | None]:
    """(the URL, None) when it is an http(s) link; (None, why it was dropped) otherwise. A
    `javascript:` or `data:` URL runs script when clicked, whatever the page escapes."""
    if not isinstance(url, str) or not url:
        return None, None
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is not None and parts.scheme in ("http", "https") and parts.netloc:
        return url, None
    shown = url if len(url) <= 80 else f"{url[:77]}..."
    return None, f"{shown!r} (only http and https links are drawn)"


def _title(fingerprint: Mapping[str, Any], family: str) -> str:
    """What a person calls the experiment: model, platform, and the host when it was a remote server."""
    platform = fingerprint.get("platform")
    if isinstance(platform, Mapping):
        gpus = platform.get("gpus")
        platform = ", ".join(map(str, gpus)) if isinstance(gpus, list) and gpus else platform.get("arch")
    parts = [str(v) for v in (fingerprint.get("model"), platform, fingerprint.get("host")) if v]
    return " · ".join(parts) or family


def _bisect_line(found: BisectRecord | None) -> str | None:
    """What `track bisect` answered for a change (History.bisects): its culprit, or its status and
    message when it named none; None when the change was never bisected."""
    if found is None:
        return None
    if found.get("culprit"):
        return f"culprit {found['culprit']}"
    message = found["result"].get("message")
    return f"{found['status']}: {message}" if message else str(found["status"])


def _round(value: float | None) -> float | None:
    """Four significant digits: the page carries thousands of samples, and no chart shows more."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")


def _commit_url(commit: str | None, github_repo: str) -> str | None:
    return f"https://github.com/{github_repo}/commit/{commit}" if commit and _SHA.fullmatch(commit) else None


def _speedups(points: Sequence[Point], base: str) -> dict[str, list[tuple[int, float, int]]]:
    """changes.SPEEDUP per build, as `check` tests it: the base variant's token-ITL p50 over the
    variant's (each the median over the build's valid trials), where both are valid; with the id of
    the variant's first point there, whose samples the panel shows."""
    itl: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    first: dict[tuple[str, int], int] = {}
    invalid: set[tuple[str, int]] = set()
    for p in points:
        if p.validity != VALID:
            invalid.add((p.variant, p.order))
        elif (value := p.values.get("itl_p50")) is not None and value > 0:
            itl[p.variant][p.order].append(value)
            first.setdefault((p.variant, p.order), p.id)
    out: dict[str, list[tuple[int, float, int]]] = {}
    base_itl = itl.get(base, {})
    for variant, by_order in sorted(itl.items()):
        if variant == base:
            continue
        out[variant] = [
            (order, median(base_itl[order]) / median(values), first[(variant, order)])
            for order, values in sorted(by_order.items())
            if order in base_itl and (base, order) not in invalid and (variant, order) not in invalid
        ]
    return out


def _gapped(
    rows: Iterable[tuple[int, float | None, int]], breaks: set[int]
) -> tuple[list[int | None], list[float | None], list[int | None]]:
    """x, y, ids of a line that breaks (a None) across every build in `breaks`: an invalid build is a
    hole in the series, never a value."""
    xs: list[int | None] = []
    ys: list[float | None] = []
    ids: list[int | None] = []
    last: int | None = None
    for order, value, pid in rows:
        if value is None:
            continue
        if last is not None and any(last < b < order for b in breaks):
            xs.append(None)
            ys.append(None)
            ids.append(None)
        xs.append(order)
        ys.append(_round(value))
        ids.append(pid)
        last = order
    return xs, ys, ids


def _scatter(count: int) -> str:
    return "scatter" if count <= _SVG_LIMIT else "scattergl"


class _Page:
    """One family's figure, panels' data and change list."""

    def __init__(
        self,
        family: str,
        points: Sequence[Point],
        changes: Sequence[Change],
        builds: Mapping[int, _Build],
        samples: Mapping[int, Samples],
        bisects: Mapping[str, BisectRecord],
        base: str,
        github_repo: str,
    ) -> None:
        self.family = family
        self.bisects = bisects
        self.points = sorted(points, key=lambda p: (p.order, p.id))
        self.changes = changes
        self.builds = builds
        self.samples = samples
        self.base = base
        self.github_repo = github_repo
        variants = sorted({p.variant for p in points}, key=lambda v: (v != base, v))
        self.variants = variants
        self.colour = {v: _VARIANT_COLOURS[i % len(_VARIANT_COLOURS)] for i, v in enumerate(variants)}
        self.invalid_orders = {v: {p.order for p in self.points if p.variant == v and p.validity != VALID}
                               for v in variants}  # fmt: skip

    def point_json(self, p: Point) -> PointJSON:
        b = self.builds.get(p.id)
        commit = b.commit if b else None
        return {
            "id": p.id,
            "variant": p.variant,
            "order": p.order,
            "build": p.build,
            "commit": commit,
            "commit_url": _commit_url(commit, self.github_repo),
            "flavour": b.flavour if b else None,
            "run_dir": b.run_dir if b else None,
            "requests": b.requests if b else None,
            "errors": b.errors if b else None,
            "validity": p.validity,
            "reason": p.reason,
            "values": {k: _round(v) for k, v in p.values.items()},
        }

    def change_json(self, change: Change) -> ChangeRow:
        """The change as `check --json` gives it, with its bisection: the answer's line, the culprit's
        commit link, GitHub's diff of the answer range and the bisect's folder."""
        found = self.bisects.get(change.id)
        result: JSONObject = found["result"] if found else {}
        compare_url, dropped = _link(result.get("compare_url"))
        bisect_dir = result.get("dir")
        return {
            **change.to_json(),
            "bisect": _bisect_line(found),
            "culprit_url": _commit_url(found["culprit"] if found else None, self.github_repo),
            "compare_url": compare_url,
            "bisect_dir": bisect_dir if isinstance(bisect_dir, str) else None,
            "colour": CLASS_COLOURS.get(change.change_class, "#444"),
            "dropped": [f"compare_url {dropped}"] if dropped else [],
        }

    @property
    def open(self) -> list[Change]:
        return open_changes(self.changes)

    def _series_traces(self, spec: SeriesSpec, axis: str) -> list[Trace]:
        traces: list[Trace] = []
        for variant in self.variants:
            rows = [
                (p.order, p.values.get(spec.name), p.id)
                for p in self.points
                if p.variant == variant and p.validity == VALID
            ]
            xs, ys, ids = _gapped(rows, self.invalid_orders[variant])
            traces.append(self._trace(spec, variant, axis, xs, ys, ids))
        return traces

    def _speedup_traces(self, axis: str) -> list[Trace]:
        traces = []
        for variant, rows in _speedups(self.points, self.base).items():
            breaks = self.invalid_orders[variant] | self.invalid_orders.get(self.base, set())
            xs, ys, ids = _gapped(rows, breaks)
            trace = self._trace(SPEEDUP, variant, axis, xs, ys, ids)
            trace["name"] = html.escape(f"{variant}/{self.base}")
            traces.append(trace)
        return traces

    def _trace(
        self,
        spec: SeriesSpec,
        variant: str,
        axis: str,
        xs: list[int | None],
        ys: list[float | None],
        ids: list[int | None],
    ) -> Trace:
        unit = _UNITS.get(spec.name, "")
        by_id = {p.id: p for p in self.points}
        text = [html.escape(by_id[i].build) if i is not None else None for i in ids]
        return {
            "type": _scatter(len(xs)),
            "mode": "lines+markers",
            "x": xs,
            "y": ys,
            "yaxis": axis,
            "name": html.escape(variant),
            "legendgroup": variant,
            "showlegend": spec.name == "itl_p50",
            "line": {"color": self.colour.get(variant, "#444"), "width": 1.5},
            "marker": {"size": 6},
            "customdata": ids,
            "text": text,
            "hovertemplate": (
                f"<b>{html.escape(variant)}</b> build %{{x}}: %{{text}}<br>"
                f"{html.escape(spec.label)}: %{{y:.4g}} {unit}<extra>click: commit, requests</extra>"
            ),
            "meta": {"kind": "point", "series": spec.name, "variant": variant, "sample": spec.sample},
        }

    def _lane_traces(self) -> list[Trace]:
        """The validity lane: every point as a dot on its variant's line, an invalid one as a large
        cross in its class's colour, and the change markers on a line of their own."""
        traces: list[Trace] = []
        for variant in self.variants:
            mine = [p for p in self.points if p.variant == variant]
            for valid in (True, False):
                chosen = [p for p in mine if (p.validity == VALID) == valid]
                colours = [CLASS_COLOURS[_INVALID_CLASS.get(p.validity, CORRECTNESS)] for p in chosen]
                traces.append(
                    {
                        "type": _scatter(len(chosen)),
                        "mode": "markers",
                        "x": [p.order for p in chosen],
                        "y": [html.escape(variant)] * len(chosen),
                        "yaxis": "y",
                        "showlegend": False,
                        "name": html.escape(f"{variant} {'valid' if valid else 'invalid'}"),
                        "marker": (
                            {"size": 5, "color": "#9e9e9e"}
                            if valid
                            else {"size": 11, "symbol": "x", "color": colours}
                        ),
                        "customdata": [p.id for p in chosen],
                        "text": [
                            html.escape(p.build if valid else f"{p.build}: {p.reason or p.validity}")
                            for p in chosen
                        ],
                        "hovertemplate": (
                            f"{html.escape(variant)} build %{{x}}: %{{text}}"
                            f"<extra>{'valid' if valid else 'not a measurement'}</extra>"
                        ),
                        "meta": {
                            "kind": "point" if valid else "invalid",
                            "series": "validity",
                            "variant": variant,
                            "sample": "itl_ms",
                        },
                    }
                )
        marks = [self.change_json(c) for c in self.changes]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [c["order"] for c in marks],
                "y": ["changes"] * len(marks),
                "yaxis": "y",
                "showlegend": False,
                "name": "changes",
                "marker": {
                    "size": 16,
                    "symbol": [
                        "triangle-down" if c["kind"] == "regression" else "triangle-up" for c in marks
                    ],
                    "color": [c["colour"] for c in marks],
                    "line": {"width": 1, "color": "#222"},
                },
                "customdata": list(range(len(marks))),
                "text": [
                    html.escape(c["summary"])
                    + f"<br>[{html.escape(', '.join((c['state'], c['class'], c['kind'])))}]<br>bisect: "
                    + html.escape(c["bisect"] or "not bisected")
                    for c in marks
                ],
                "hovertemplate": "%{text}<extra>change</extra>",
                "meta": {"kind": "change"},
            }
        )
        return traces

    def _shapes(self) -> list[Shape]:
        """A line at each change (dashed for a fix or improvement) and a shaded band over each run of
        invalid builds, across every row."""
        shapes: list[Shape] = []
        for change in self.changes:
            colour = CLASS_COLOURS.get(change.change_class, "#444")
            at = change.order - 0.5
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": at,
                    "x1": at,
                    "y0": 0,
                    "y1": 1,
                    "line": {
                        "color": colour,
                        "width": 2,
                        "dash": "solid" if change.kind == "regression" else "dot",
                    },
                }
            )
        invalid: dict[int, str] = {}
        for p in self.points:
            if p.validity != VALID:
                invalid.setdefault(p.order, _INVALID_CLASS.get(p.validity, CORRECTNESS))
        orders = sorted({p.order for p in self.points})
        run: list[int] = []
        for order in [*orders, None]:
            if order is not None and order in invalid and (not run or invalid[run[0]] == invalid[order]):
                run.append(order)
                continue
            if run:
                shapes.append(
                    {
                        "type": "rect",
                        "xref": "x",
                        "yref": "paper",
                        "x0": run[0] - 0.5,
                        "x1": run[-1] + 0.5,
                        "y0": 0,
                        "y1": 1,
                        "fillcolor": CLASS_COLOURS[invalid[run[0]]],
                        "opacity": 0.12,
                        "line": {"width": 0},
                        "layer": "below",
                    }
                )
            run = [order] if order is not None and order in invalid else []
        return shapes

    def figure(self) -> Figure:
        rows: list[tuple[str, str]] = []
        for spec in SERIES[:2]:
            rows.append((spec.name, f"{spec.label} ({_UNITS[spec.name]})"))
        if len(self.variants) > 1 and self.base in self.variants:
            rows.append((SPEEDUP.name, f"speedup over {self.base} (×)"))
        for spec in SERIES[2:]:
            # A server series gets a row only where some point has it (a run that sampled /metrics).
            if spec.change_class != SERVER or any(p.values.get(spec.name) is not None for p in self.points):
                rows.append((spec.name, f"{spec.label} ({_UNITS[spec.name]})"))
        lane_height = 0.025 * (len(self.variants) + 1)
        row_height = (1 - lane_height) / len(rows)
        layout: dict[str, object] = {
            "height": 120 + 40 * (len(self.variants) + 1) + 170 * len(rows),
            "margin": {"l": 70, "r": 20, "t": 30, "b": 40},
            "hovermode": "closest",
            "dragmode": "zoom",
            "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
            "xaxis": {
                "title": {"text": "build (first-parent order)"},
                "anchor": f"y{len(rows) + 1}",
                "showspikes": True,
            },
            "yaxis": {
                "domain": [1 - lane_height, 1],
                "type": "category",
                "categoryorder": "array",
                "categoryarray": [*(html.escape(v) for v in reversed(self.variants)), "changes"],
                "fixedrange": True,
            },
            "shapes": self._shapes(),
        }
        traces = self._lane_traces()
        for i, (name, title) in enumerate(rows):
            axis = f"y{i + 2}"
            top = 1 - lane_height - i * row_height - 0.02
            layout[f"yaxis{i + 2}"] = {
                "domain": [max(top - row_height + 0.03, 0), top],
                "title": {"text": title, "font": {"size": 11}},
                "anchor": "x",
            }
            if name == SPEEDUP.name:
                traces += self._speedup_traces(axis)
            else:
                traces += self._series_traces(next(s for s in SERIES if s.name == name), axis)
        return {"data": traces, "layout": layout, "config": {"responsive": True, "displaylogo": False}}

    def data(self) -> PageData:
        """What the panels read: every point, the embedded raw samples, every change."""
        return {
            "family": self.family,
            "base": self.base,
            "points": {p.id: self.point_json(p) for p in self.points},
            "samples": {
                pid: {k: [_round(v) for v in vs] for k, vs in s.items()} for pid, s in self.samples.items()
            },
            "changes": [self.change_json(c) for c in self.changes],
            "labels": {spec.sample: spec.label.replace(" p50", "") for spec in SERIES},
        }

    def sparkline(self) -> Figure:
        """Token-ITL p50 per variant, invalid builds as holes: the index's one-glance history."""
        spec = SERIES[0]
        traces: list[Trace] = []
        for variant in self.variants:
            rows = [
                (p.order, p.values.get(spec.name), p.id)
                for p in self.points
                if p.variant == variant and p.validity == VALID
            ]
            xs, ys, _ = _gapped(rows, self.invalid_orders[variant])
            traces.append(
                {
                    "type": _scatter(len(xs)),
                    "mode": "lines",
                    "x": xs,
                    "y": ys,
                    "name": html.escape(variant),
                    "line": {"color": self.colour[variant], "width": 1.2},
                    "meta": {"kind": "spark", "variant": variant},
                }
            )
        layout: dict[str, object] = {
            "height": 44,
            "width": 220,
            "margin": {"l": 0, "r": 0, "t": 2, "b": 2},
            "showlegend": False,
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "shapes": [s for s in self._shapes() if s["type"] == "rect"],
        }
        return {"data": traces, "layout": layout, "config": {"staticPlot": True}}

    def status(self) -> tuple[str, str]:
        """(css class, text): open regressions first, then suspected ones, then the newest build."""
        still_open = self.open
        if still_open:
            return "bad", f"{len(still_open)} open regression(s)"
        suspected = [c for c in self.changes if c.state == SUSPECTED]
        if suspected:
            return "warn", f"{len(suspected)} suspected: run another trial"
        newest = max(p.order for p in self.points)
        bad = [p for p in self.points if p.order == newest and p.validity != VALID]
        if bad:
            return "bad", f"newest build not a measurement: {bad[0].reason or bad[0].validity}"
        return "ok", "ok"


def _finite(data: Any) -> Any:
    """The data with every NaN or infinity as null: JSON.parse refuses them, and a change's evidence
    may hold one (a test that could not run)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def _page_html(title: str, body: str, data: Mapping[str, Any], figures: Mapping[str, Any]) -> str:
    blob = json.dumps(_finite({"page": data, "figures": figures}), separators=(",", ":"), allow_nan=False)
    # The JSON sits in a <script>: no "</script>" may end it early and no "<!--" turn the rest of the
    # page into script data (a /version of "<!--<script>" once made a page draw nothing).
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="itlaudit track publish">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="dashboard.css">
<script src="plotly.min.js"></script>
</head><body>
{body}
<script id="dashboard-data" type="application/json">{blob}</script>
<script src="dashboard.js"></script>
</body></html>
"""


def _change_rows(changes: Sequence[Mapping[str, Any]], pages: Mapping[str, str] | None = None) -> str:
    """The change table: first bad and last good build, class, state, the summary and the bisect's
    culprit. With `pages` (change id → the fingerprint page's title, on the index) a first column
    links each change to its fingerprint's page."""
    if not changes:
        return '<p class="none">none</p>'
    rows = []
    for c in changes:
        cells = []
        if pages is not None:
            href = html.escape(f"{c['family']}.html#change-{c['id']}")
            cells.append(f'<td><a href="{href}">{html.escape(pages[c["id"]])}</a></td>')
        closed = f", closed by {c['closed_by']}" if c["closed_by"] else ""
        cells += [
            f"<td>{html.escape(c['build'])}</td>",
            f"<td>{html.escape(c['last_good_build'] or '–')}</td>",
            f"<td>{html.escape(c['class'])}</td>",
            f"<td>{html.escape(c['kind'])}</td>",
            f"<td>{html.escape(c['state'] + closed)}</td>",
            f"<td>{html.escape(c['summary'])}</td>",
            f'<td class="culprit">{html.escape(c["bisect"] or "not bisected")}</td>',
        ]
        rows.append(
            f'<tr class="change" data-change="{html.escape(c["id"])}" '
            f'style="border-left:6px solid {c["colour"]}">{"".join(cells)}</tr>'
        )
    names = ["first bad", "last good", "class", "kind", "state", "what", "bisect"]
    if pages is not None:
        names.insert(0, "fingerprint")
    head = "".join(f"<th>{n}</th>" for n in names)
    return f'<table class="changes"><tr>{head}</tr>{"".join(rows)}</table>'


_LEGEND_TAIL = "▼ regression, ▲ fix or improvement; shaded: builds that are not measurements."
_HINT = (
    "Click a point for its build, commit and requests; a ▼/▲ marker for its change and bisect result. "
    "Drag to zoom, double-click to reset."
)


def _legend() -> str:
    items = "".join(
        f'<span class="swatch" style="background:{colour}"></span>{html.escape(cls)} '
        for cls, colour in CLASS_COLOURS.items()
    )
    return f'<p class="legend">Change classes: {items} — {_LEGEND_TAIL}</p>'


def _family_page(page: _Page, title: str, fingerprint: Mapping[str, Any], where: str) -> str:
    data = page.data()
    listed_ids = {c.id for c in page.open} | {c.id for c in page.changes if c.state == SUSPECTED}
    listed = [c for c in data["changes"] if c["id"] in listed_ids]
    builds = len({p.order for p in page.points})
    shown = json.dumps(fingerprint, indent=2, sort_keys=True)
    dropped = "; ".join(f"change {c['id']}: {said}" for c in data["changes"] for said in c["dropped"])
    notice = (
        f'<p class="dropped">Links of the history not drawn: {html.escape(dropped)}</p>\n' if dropped else ""
    )
    body = (
        f'<header><a href="index.html">← all fingerprints</a><h1>{html.escape(title)}</h1>\n'
        f'<p class="where">{builds} builds, variants {html.escape(", ".join(page.variants))}; '
        f"history {html.escape(where)}</p>\n"
        f"<details><summary>fingerprint {page.family}</summary><pre>{html.escape(shown)}</pre></details>"
        f"</header>\n{_legend()}\n{notice}"
        '<div class="layout"><div id="chart" class="chart"></div>\n'
        f'<aside id="detail" class="detail"><p class="hint">{_HINT}</p></aside></div>\n'
        f"<h2>Open and suspected changes</h2>{_change_rows(listed)}\n"
        f"<h2>Every change</h2>{_change_rows(data['changes'])}\n"
    )
    return _page_html(title, body, data, {"chart": page.figure()})


def _index_page(pages: Sequence[tuple[_Page, str]], where: str) -> str:
    rows = []
    figures = {}
    still_open: list[ChangeRow] = []
    titles: dict[str, str] = {}
    for page, title in pages:
        css, status = page.status()
        newest = max(page.points, key=lambda p: (p.order, p.id))
        spark = f"spark-{page.family}"
        figures[spark] = page.sparkline()
        rows.append(
            f'<tr class="fingerprint" data-family="{page.family}">'
            f'<td><a href="{page.family}.html">{html.escape(title)}</a></td>'
            f"<td>{html.escape(', '.join(page.variants))}</td>"
            f'<td><div id="{spark}" class="spark"></div></td>'
            f"<td>{html.escape(newest.build)}</td>"
            f'<td class="status {css}">{html.escape(status)}</td></tr>'
        )
        for change in page.open:
            still_open.append(page.change_json(change))
            titles[change.id] = title
    head = "".join(
        f"<th>{n}</th>" for n in ("fingerprint", "variants", "token ITL p50", "newest build", "status")
    )
    published = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = (
        f'<header><h1>itlaudit track</h1><p class="where">{len(pages)} fingerprint(s); history '
        f"{html.escape(where)}; published {published}</p></header>\n"
        f'<table class="fingerprints"><tr>{head}</tr>{"".join(rows)}</table>\n'
        f"<h2>Open regressions</h2>{_change_rows(still_open, titles)}"
    )
    return _page_html("itlaudit track", body, {"index": True}, figures)


def _prepare(out: Path) -> None:
    """Make OUT ready: new, empty, or written by an earlier publish (whose pages are then replaced);
    any other folder is refused, so a publish never mixes its pages into someone's files."""
    if out.exists() and not out.is_dir():
        raise TrackError(f"{out}: is a file; give a folder for the site, e.g. {out}-site/")
    manifest = out / MANIFEST
    if out.is_dir() and any(out.iterdir()) and not manifest.is_file():
        raise TrackError(
            f"{out}: holds other files and no {MANIFEST}; give a new or empty folder, or one that "
            "`itlaudit track publish` wrote"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        earlier = json.loads(manifest.read_text()) if manifest.is_file() else {}
    except (OSError, ValueError) as exc:
        raise TrackError(f"{out}: cannot write the site there ({exc})") from None
    for name in earlier.get("pages") or []:
        if re.fullmatch(r"[0-9a-f]{16}\.html", str(name)):
            (out / name).unlink(missing_ok=True)


def _sampled_orders(orders: Sequence[int], changes: Sequence[Change], newest: int, around: int) -> set[int]:
    """The builds whose raw samples a page carries: the newest `newest` and `around` either side of
    each change (a 10,000-build history would otherwise weigh hundreds of megabytes)."""
    chosen = set(orders[-newest:]) if newest > 0 else set()
    position = {o: i for i, o in enumerate(orders)}
    for change in changes:
        first = position.get(change.order, 0)
        start = position.get(change.last_good_order, first) if change.last_good_order is not None else first
        chosen.update(orders[max(start - around, 0) : first + around + 1])
    return chosen


def publish(
    history: History,
    out: Path,
    *,
    github_repo: str = DEFAULT_GITHUB_REPO,
    sample_builds: int = 500,
    base: str = BASE_VARIANT,
) -> Published:
    """Write the site for every family of the history into `out`."""
    try:
        from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]
    except ModuleNotFoundError:  # a core dependency: only an install that skipped dependencies lacks it
        raise TrackError(
            "track publish needs plotly, one of itlaudit's dependencies: pip install plotly"
        ) from None
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", github_repo):
        raise TrackError(f"--github-repo {github_repo}: give OWNER/NAME, e.g. {DEFAULT_GITHUB_REPO}")
    points = history.points()
    if not points:
        raise TrackError(
            f"{history.where}: the history holds no points; record runs with `itlaudit track add`"
        )
    _prepare(out)
    changes = history.check()
    bisects = history.bisects()
    builds = {pid: _Build(*row) for pid, row in history.point_builds().items()}
    fingerprints = history.fingerprints()
    by_family: dict[str, list[Point]] = defaultdict(list)
    for point in points:
        if not _FAMILY.fullmatch(point.family):
            said = f"family {point.family[:40]!r} is not a fingerprint's digest"
            raise damaged(history.where, "track_series", None, said)
        by_family[point.family].append(point)
    changes_of: dict[str, list[Change]] = defaultdict(list)
    for change in changes:
        changes_of[change.family].append(change)
    pages: list[tuple[_Page, str]] = []
    for family, members in sorted(by_family.items()):
        orders = sorted({p.order for p in members})
        keep = _sampled_orders(orders, changes_of[family], sample_builds, around=5)
        samples = history.samples([p.id for p in members if p.order in keep])
        page = _Page(family, members, changes_of[family], builds, samples, bisects, base, github_repo)
        title = _title(fingerprints.get(family, {}), family)
        pages.append((page, title))
    pages.sort(key=lambda pt: pt[1])
    try:
        (out / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")
        for name in ("dashboard.js", "dashboard.css"):
            (out / name).write_text((ASSETS / name).read_text(encoding="utf-8"), encoding="utf-8")
        for page, title in pages:
            text = _family_page(page, title, fingerprints.get(page.family, {}), history.where)
            (out / f"{page.family}.html").write_text(text, encoding="utf-8")
        index = out / "index.html"
        index.write_text(_index_page(pages, history.where), encoding="utf-8")
        manifest = {
            "generator": "itlaudit track publish",
            "published_at": time.time(),
            "history": history.where,
            "pages": [f"{page.family}.html" for page, _ in pages],
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise TrackError(f"{out}: cannot write the site there ({exc.strerror or exc})") from None
    return Published(index, len(pages), len(changes))
