"""PNG figures for report.html/report.md: each answers one question a reader has about the run.

Every figure is drawn from records and summary blocks through `metrics`' own functions, so a picture
can never disagree with the table beside it. Each function writes one PNG of a fixed size and returns
its path, or None when the run has nothing to show for that question (no empty panels in a report).
Variants keep one colour across all figures; the first variant is the baseline of every ratio. A
ratio is worded only when stats.compare_samples finds it significant (the rule diff uses), and only
between comparable variants (analysis.validity): a variant that is not comparable is drawn grey and
hatched, labelled "not comparable", and never called faster or better.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import textwrap
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from itlaudit.analysis.metrics import p50, per_chunk_itl_ms, request_metrics, speedup, token_counts
from itlaudit.analysis.server_metrics import KV_USAGE, RUNNING, WAITING, per_position_series
from itlaudit.analysis.specdecode import SpecDecodeStats
from itlaudit.analysis.stats import Comparison, compare_samples
from itlaudit.analysis.summary import VariantSummary
from itlaudit.analysis.validity import COMPARABLE, NOT_COMPARABLE, Validity, comparison_validity
from itlaudit.model.records import RequestRecord, Status
from itlaudit.report.plot_style import (
    CROWDED,
    INVALID_HATCH,
    LOG_SPAN,
    NO_VERDICT,
    TRUNCATION_RED,
    WIDE,
    Colour,
    plt,
    save_figure,
    spans_decades,
    tick_label,
    variant_colour,
    verdict_words,
)
from itlaudit.serve.orphans import die_with_parent

TIMELINE_SAMPLE = 20  # lines per panel: more is a blur, fewer hides the spread


@dataclass(frozen=True)
class VariantView:
    """One variant as the report sees it: its records, its summary.json block, its compare.json
    spec-decode figures (None when no compare.json, or the variant had no spec decode), the ids of
    its requests the findings call cut short, and whether it is comparable at all (figures read
    findings and the validity rule, they never judge records)."""

    name: str
    records: Sequence[RequestRecord]
    block: VariantSummary
    spec_decode: SpecDecodeStats | None = None
    truncated: frozenset[str] = frozenset()
    validity: Validity = COMPARABLE
    # The samplers' rows for this variant (store.server_metrics): "server" (/metrics), "gpu" (NVML).
    telemetry: Mapping[str, Sequence[dict[str, Any]]] = field(default_factory=dict)


def _colour(variants: Sequence[VariantView], view: VariantView) -> Colour:
    return variant_colour(list(variants).index(view), view.validity)


def _against_base(variants: Sequence[VariantView], view: VariantView) -> Validity:
    """The validity of view's ratio to the baseline: both must be comparable (the baseline's own
    validity when view is the baseline)."""
    base = variants[0]
    return base.validity if view is base else comparison_validity(view.validity, base.validity, base.name)


def _verdict(base: VariantView, view: VariantView, key: str, lower_is_better: bool) -> Comparison:
    """diff's rule on the two variants' per-request values of `key`: is the ratio a verdict at all."""
    samples = [[getattr(request_metrics(r), key) for r in v.records] for v in (base, view)]
    return compare_samples(*samples, lower_is_better=lower_is_better)


def _gaps(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(per-token gap, per-chunk gap) over every decode step of the finished requests, in ms."""
    token, chunk = [], []
    for record in records:
        if record.status != Status.OK:
            continue
        t, _, _ = token_counts(record)
        token.append(per_chunk_itl_ms(record))
        chunk.append(np.diff(t))
    if not token:
        return np.array([]), np.array([])
    return np.concatenate(token), np.concatenate(chunk)


# The CDF's x axis ends here when a few steps lie far beyond it: one 37 ms stall must not squeeze every
# curve below 20 ms into the left third. The curves still reach 1 (off the axis), and the label says so.
CDF_CLIP_PERCENTILE = 99.5
_CDF_STRETCH = 1.5  # clip only when the largest step is this far past the percentile


def plot_itl_cdf(variants: Sequence[VariantView], path: Path) -> Path | None:
    """Token ITL solid, chunk ITL dashed, same colour: the horizontal gap between them is the
    inflation a chunk-counting benchmark reports. The legend sits under the axes, where it covers no
    curve however many variants there are."""
    fig, ax = plt.subplots(figsize=WIDE)
    everything = []
    for view in variants:
        token, chunk = _gaps(view.records)
        if token.size == 0:
            continue
        everything += [token, chunk]
        # K0's two curves coincide: say so, or the reader hunts for a dashed line that is hidden.
        same = token.shape == chunk.shape and np.allclose(token, chunk)
        chunk_label = "per chunk (= per token)" if same else "per chunk"
        mark = "" if view.validity.comparable else f" ({NOT_COMPARABLE})"
        for values, style, label in ((token, "-", "per token"), (chunk, "--", chunk_label)):
            ordered = np.sort(values)
            share = np.arange(1, ordered.size + 1) / ordered.size
            ax.step(
                ordered,
                share,
                style,
                where="post",
                color=_colour(variants, view),
                lw=2,
                label=f"{view.name} {label}{mark}",
            )
    if not everything:
        plt.close(fig)
        return None
    values = np.concatenate(everything)
    if spans_decades(values):
        ax.set_xscale("log")
    xlabel = "inter-token latency (ms)"
    clip = float(np.percentile(values, CDF_CLIP_PERCENTILE))
    if clip > 0 and values.max() > clip * _CDF_STRETCH:
        beyond = int((values > clip).sum())
        ax.set_xlim(right=clip * 1.05)
        xlabel += (
            f"; axis clipped at the {CDF_CLIP_PERCENTILE:g}th percentile ({clip:.1f} ms): {beyond} of "
            f"{values.size} steps lie beyond, up to {values.max():.1f} ms"
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of decode steps ≤ x")
    ax.set_ylim(0, 1.02)
    ax.set_title(
        "ITL distribution: per token (solid, true) vs per chunk (dashed, what chunk-counting tools report)"
    )
    ax.grid(alpha=0.3, which="both")
    labels = [str(line.get_label()) for line in ax.get_lines()]
    # As many columns as the figure's width holds at 8 pt (~5.5 px a character, 45 px of line sample).
    ncols = max(1, min(4, len(labels), int(WIDE[0] * 95 // (45 + 5.5 * max(map(len, labels))))))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=ncols, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_tokens_per_chunk(variants: Sequence[VariantView], path: Path) -> Path | None:
    """Share of chunks carrying 1, 2, … tokens: K0 is all ones, spec decode spreads up to K+1."""
    hists = [{int(k): v for k, v in view.block.tokens_per_chunk_hist.items()} for view in variants]
    largest = max((k for h in hists for k in h), default=0)
    if largest < 1:
        return None
    sizes = list(range(1, largest + 1))  # every size, so a missing "2" reads as 0 %, not as absent
    fig, ax = plt.subplots(figsize=WIDE)
    x = np.arange(len(sizes))
    width = 0.8 / len(variants)
    for i, (view, hist) in enumerate(zip(variants, hists, strict=True)):
        total = sum(hist.values())
        if not total:
            continue
        shares = [100.0 * hist.get(k, 0) / total for k in sizes]
        mean = sum(k * v for k, v in hist.items()) / total
        ax.bar(
            x + (i - (len(variants) - 1) / 2) * width,
            shares,
            width,
            color=_colour(variants, view),
            hatch=None if view.validity.comparable else INVALID_HATCH,
            label=f"{view.name} (mean {mean:.2f} tokens/chunk)"
            + ("" if view.validity.comparable else f", {NOT_COMPARABLE}"),
        )
    ax.set_xticks(x, [str(k) for k in sizes])
    ax.set_xlabel("tokens carried by one SSE chunk")
    ax.set_ylabel("share of content chunks (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Tokens per chunk: under speculative decoding one chunk carries several tokens")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def _sample(records: Sequence[RequestRecord], k: int) -> list[RequestRecord]:
    """Evenly spaced, so a long run shows early, middle and late requests, not just the first k."""
    if len(records) <= k:
        return list(records)
    return [records[int(i)] for i in np.linspace(0, len(records) - 1, k)]


def plot_timeline(variants: Sequence[VariantView], path: Path) -> Path | None:
    """Cumulative tokens over time per request: a cap shows as lines that stop at one height, red."""
    shown = [v for v in variants if any(r.status == Status.OK and len(r.chunks) for r in v.records)]
    if not shown:
        return None
    cols = min(3, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(WIDE[0], 4.0 * rows), sharex=True, sharey=True, squeeze=False
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    for ax, view in zip(axes.flat, shown, strict=False):
        _timeline_panel(ax, view, _colour(variants, view))
    for ax in axes[-1]:
        ax.set_xlabel("time since request sent (s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("completion tokens (server count)")
    fig.suptitle("Per-request progress: slope = tokens/s; red = cut short by the server")
    fig.tight_layout()
    return save_figure(fig, path)


def _timeline_panel(ax: Axes, view: VariantView, line_colour: Colour) -> None:
    finished = [r for r in view.records if r.status == Status.OK and len(r.chunks)]
    cut = [r for r in finished if r.request_id in view.truncated]
    whole = [r for r in finished if r not in cut]
    for record, truncated in [(r, False) for r in _sample(whole, TIMELINE_SAMPLE)] + [
        (r, True) for r in _sample(cut, TIMELINE_SAMPLE)
    ]:
        t, cumulative, _ = token_counts(record)
        ax.plot(
            np.concatenate(([0.0], t)) / 1000.0,
            np.concatenate(([0], cumulative)),
            color=TRUNCATION_RED if truncated else line_colour,
            lw=1.8 if truncated else 1.0,
            alpha=0.9 if truncated else 0.6,
        )
    limits = {r.params.max_tokens for r in finished if r.params.max_tokens}
    for limit in limits:
        ax.axhline(limit, color="grey", ls=":", lw=1)
    if len(limits) == 1:
        ax.annotate(
            "max_tokens",
            (0, next(iter(limits))),
            xytext=(3, 3),
            textcoords="offset points",
            color="grey",
            fontsize=8,
        )
    title = f"{view.name}: {len(finished)} request{'s' if len(finished) != 1 else ''}"
    if cut:
        title += f", {len(cut)} cut short"
    if not view.validity.comparable:
        title += f"\n{NOT_COMPARABLE}"  # a line of its own: three panels side by side are narrow
    ax.set_title(title, color=TRUNCATION_RED if cut or not view.validity.comparable else "black", fontsize=10)
    ax.grid(alpha=0.3)


# (summary key, axis label, lower is better)
_BAR_METRICS = (
    ("itl_ms", "token ITL (ms)", True),
    ("ttft_ms", "TTFT (ms)", True),
    ("decode_tokens_per_s", "decode tokens/s per request", False),
)
_PERCENTILES = (("p50", 1.0), ("p90", 0.65), ("p99", 0.35))  # (key, bar opacity)
# Characters per line of a bar group's annotation: three groups share a third of the figure, so
# "2.85× better" and "not comparable" side by side need two lines each to stay apart.
_ANNOTATION_WIDTH = 10


def plot_latency_bars(variants: Sequence[VariantView], path: Path) -> Path | None:
    """p50/p90/p99 per variant for the three figures people quote, each non-baseline bar group
    annotated with its p50 ratio to the baseline where diff's rule calls it a verdict; a variant that
    is not comparable is grey, hatched and annotated so instead."""
    if not any(p50(v.block.distributions, key) is not None for v in variants for key, _, _ in _BAR_METRICS):
        return None
    if len(variants) > CROWDED:  # stacked, the variant names under the last panel only
        fig, axes = plt.subplots(
            len(_BAR_METRICS), 1, figsize=(WIDE[0], 2.8 * len(_BAR_METRICS)), sharex=True
        )
    else:
        fig, axes = plt.subplots(1, len(_BAR_METRICS), figsize=WIDE)
    for ax, (key, label, lower) in zip(axes, _BAR_METRICS, strict=True):
        _bar_panel(ax, variants, key, label, lower)
    handles = [Rectangle((0, 0), 1, 1, color="grey", alpha=a) for _, a in _PERCENTILES]
    fig.legend(handles, [p for p, _ in _PERCENTILES], loc="upper right", ncols=3, fontsize=9)
    fig.suptitle(
        "Latency and throughput per variant\n"
        f"ratio: p50 vs {variants[0].name}, worded only when significant (Mann–Whitney p < 0.05)",
        x=0.01,
        ha="left",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))  # the two-line title
    return save_figure(fig, path)


def _ratio_words(
    variants: Sequence[VariantView], view: VariantView, key: str, lower: bool, better: str, worse: str
) -> tuple[str, str] | None:
    """(words, colour) for view's p50 ratio to the baseline: "not comparable" in red when the pair
    breaks the validity rule, else verdict_words over diff's significance rule."""
    if not _against_base(variants, view).comparable:
        return NOT_COMPARABLE, TRUNCATION_RED
    base = variants[0]
    factor = speedup(p50(base.block.distributions, key), p50(view.block.distributions, key), lower)
    if factor is None:
        return None
    return verdict_words(_verdict(base, view, key, lower), factor, better, worse)


def _bar_panel(ax: Axes, variants: Sequence[VariantView], key: str, label: str, lower: bool) -> None:
    width = 0.8 / len(_PERCENTILES)
    tops: list[float] = []
    for i, view in enumerate(variants):
        stats = view.block.distributions.get(key) or {}
        invalid = not view.validity.comparable
        for j, (p, alpha) in enumerate(_PERCENTILES):
            if (value := stats.get(p)) is not None:
                ax.bar(
                    i + (j - 1) * width,
                    value,
                    width,
                    color=_colour(variants, view),
                    alpha=alpha,
                    hatch=INVALID_HATCH if invalid else None,
                    edgecolor=TRUNCATION_RED if invalid else None,
                    lw=0.6 if invalid else 0,
                )
                tops.append(value)
    if not tops:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    log = max(tops) / max(min(tops), 1e-9) > LOG_SPAN
    if log:
        ax.set_yscale("log")
    for i, view in enumerate(variants):
        stats = view.block.distributions.get(key) or {}
        top = max(v for p, _ in _PERCENTILES if (v := stats.get(p)) is not None) if stats.get("p50") else None
        ranked = i or not view.validity.comparable  # the baseline is annotated only when invalid
        words = _ratio_words(variants, view, key, lower, "better", "worse") if ranked else None
        if words is not None and top is not None:
            ax.annotate(
                textwrap.fill(words[0], _ANNOTATION_WIDTH),
                (i, top),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                fontweight="bold",
                color=words[1],
            )
    ax.set_ylim(top=max(tops) * (4 if log else 1.3))  # room for two-line annotations
    ax.set_xticks(range(len(variants)), [tick_label(v.name) for v in variants], fontsize=9)
    ax.set_title(label + (" (log)" if log else ""), fontsize=10)
    ax.grid(axis="y", alpha=0.3, which="both")


def plot_itl_headline(variants: Sequence[VariantView], path: Path) -> Path | None:
    """Token ITL next to chunk ITL (p50) per variant, each variant's per-token ratio to the baseline
    under its name: the ten-second answer to "is K3 faster?". The ratio is worded only when diff's
    rule finds it significant, and only between comparable variants: one that is not comparable is
    grey and hatched, its label says "not comparable" and why, in red."""
    pairs = [
        (p50(v.block.distributions, "itl_ms"), p50(v.block.distributions, "chunk_itl_ms")) for v in variants
    ]
    if all(token is None for token, _ in pairs):
        return None
    fig, ax = plt.subplots(figsize=WIDE)
    width = 0.38
    crowded = len(variants) > CROWDED
    top = max(x for pair in pairs for x in pair if x is not None)
    for i, (view, pair) in enumerate(zip(variants, pairs, strict=True)):
        invalid = not view.validity.comparable
        for offset, value, hatched, what in zip(
            (-width / 2, width / 2), pair, (False, True), ("per token", "per chunk"), strict=True
        ):
            if value is None:
                continue
            ax.bar(
                i + offset,
                value,
                width,
                color=_colour(variants, view),
                alpha=0.45 if hatched else 1.0,
                hatch=INVALID_HATCH if invalid else "//" if hatched else None,
                edgecolor=TRUNCATION_RED if invalid else "black",
                lw=0.6,
            )
            ax.annotate(
                f"{value:.1f}" if crowded else f"{value:.2f} ms\n{what}",
                (i + offset, value),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=8 if crowded else 9,
            )
    suffix = "" if crowded else " per token"
    labels, label_colours = [], []
    for i, view in enumerate(variants):
        name = tick_label(view.name) + ("\n(baseline)" if i == 0 else "")
        validity = _against_base(variants, view)
        if not validity.comparable:
            # The reason in the label, in red: a reader of this figure alone must see why.
            reason = tick_label(f"{NOT_COMPARABLE}: {validity.reason}", 30)
            labels.append(f"{name}\n{reason}")
            label_colours.append(TRUNCATION_RED)
            continue
        words = _ratio_words(variants, view, "itl_ms", True, "faster", "slower") if i else None
        if words:
            name += f"\n{words[0]}" + ("" if words[0].startswith(NO_VERDICT) else suffix)
        labels.append(name)
        label_colours.append("black")
    # All bars at 0 (one-token replies have no ITL): an empty axis rather than a singular one.
    ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)
    ax.set_xticks(range(len(variants)), labels, fontsize=8 if crowded else 9)
    for tick, tick_colour in zip(ax.get_xticklabels(), label_colours, strict=True):
        tick.set_color(tick_colour)
    ax.set_ylabel("ITL p50 over requests (ms)")
    ax.set_title("Token ITL (solid: lower is faster) vs chunk ITL (hatched: inflated by tokens per chunk)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_acceptance(variants: Sequence[VariantView], path: Path) -> Path | None:
    """Per-position draft acceptance from /metrics: where along the draft the speculation fails."""
    rates = [(v, v.spec_decode.per_position_acceptance if v.spec_decode else []) for v in variants]
    rates = [(v, r) for v, r in rates if r]
    if not rates:
        return None
    fig, ax = plt.subplots(figsize=WIDE)
    positions = max(len(r) for _, r in rates)
    width = 0.8 / len(rates)
    for k, (view, values) in enumerate(rates):
        al = view.spec_decode.acceptance_length if view.spec_decode else None
        label = view.name + (f" (acceptance length {al:.2f})" if al is not None else "")
        ax.bar(
            np.arange(1, len(values) + 1) + (k - (len(rates) - 1) / 2) * width,
            values,
            width,
            color=_colour(variants, view),
            label=label,
        )
    ax.set_xticks(range(1, positions + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.1)
    ax.set_title("Draft acceptance per position (server /metrics, this run's traffic only)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


SERVER_TIMELINE_SIZE = (WIDE[0], 9.4)  # inches: up to five panels a column, each readable


def _window_rows(view: VariantView, kind: str) -> list[dict[str, Any]]:
    return [r for r in view.telemetry.get(kind, ()) if "t_ns" in r and "error" not in r]


def _server_panels(view: VariantView) -> list[str]:
    """The timeline's rows this variant has data for, top to bottom."""
    server, gpu = _window_rows(view, "server"), _window_rows(view, "gpu")
    gauges = {k for r in server for k in r.get("gauges", {})}
    panels = ["itl"]
    panels += ["load"] if {RUNNING, WAITING} & gauges else []
    panels += ["kv"] if KV_USAGE in gauges else []
    panels += ["acceptance"] if per_position_series(server) else []
    panels += ["gpu"] if gpu else []
    return panels


def plot_server_timeline(variants: Sequence[VariantView], path: Path) -> Path | None:
    """The measured window on one clock (the capture's monotonic clock, seconds from its first
    sample): token ITL of every chunk as a point, beside what the server and GPU said meanwhile:
    running and waiting requests, KV-cache usage, draft acceptance per position, GPU SM clock. A
    column per variant sampled; rows for what it has."""
    shown = [(v, _server_panels(v)) for v in variants if _window_rows(v, "server") or _window_rows(v, "gpu")]
    if not shown:
        return None
    rows = max(len(panels) for _, panels in shown)
    fig, axes = plt.subplots(rows, len(shown), figsize=SERVER_TIMELINE_SIZE, sharex="col", squeeze=False)
    for col, (view, panels) in enumerate(shown):
        for row, ax in enumerate(axes[:, col]):
            if row >= len(panels):
                ax.set_visible(False)
                continue
            _server_panel(ax, view, panels[row], _colour(variants, view))
            if row == 0:
                title = view.name if view.validity.comparable else f"{view.name}\n{NOT_COMPARABLE}"
                ax.set_title(
                    title, fontsize=10, color="black" if view.validity.comparable else TRUNCATION_RED
                )
        last = axes[len(panels) - 1, col]
        last.set_xlabel("seconds into the measured window")
        last.tick_params(labelbottom=True)  # a shorter column's times: its shared axis hid them
    fig.suptitle("Stream and server on one clock: why a figure moved")
    fig.tight_layout()
    return save_figure(fig, path)


def _server_panel(ax: Axes, view: VariantView, panel: str, colour: Colour) -> None:
    server, gpu = _window_rows(view, "server"), _window_rows(view, "gpu")
    starts = [r["t_ns"] for r in server + gpu]
    t0 = min(starts)

    def seconds(rows: list[dict[str, Any]]) -> np.ndarray:
        out: np.ndarray = (np.array([r["t_ns"] for r in rows], dtype=float) - t0) / 1e9
        return out

    if panel == "itl":
        xs, ys = [], []
        for record in view.records:
            if record.status != Status.OK or record.sent_monotonic_ns is None or len(record.chunks) < 2:
                continue
            t, _, _ = token_counts(record)
            xs.append((record.sent_monotonic_ns - t0) / 1e9 + t[1:] / 1000.0)
            ys.append(per_chunk_itl_ms(record))
        if xs:
            ax.scatter(np.concatenate(xs), np.concatenate(ys), s=3, alpha=0.35, color=colour, linewidths=0)
        ax.set_ylabel("token ITL (ms)")
    elif panel == "load":
        for name, label, style in ((RUNNING, "running", "-"), (WAITING, "waiting", "--")):
            have = [r for r in server if name in r["gauges"]]
            ax.plot(seconds(have), [r["gauges"][name] for r in have], style, color=colour, label=label)
        ax.set_ylabel("requests")
        ax.legend(fontsize=8, loc="upper right")
    elif panel == "kv":
        have = [r for r in server if KV_USAGE in r["gauges"]]
        ax.plot(seconds(have), [100 * r["gauges"][KV_USAGE] for r in have], color=colour)
        ax.set_ylabel("KV cache (%)")
        ax.set_ylim(bottom=0)
    elif panel == "acceptance":
        series = per_position_series(server)
        for i in range(max(len(p["acceptance"]) for p in series)):
            have = [p for p in series if i < len(p["acceptance"])]
            times = (np.array([p["t_ns"] for p in have], dtype=float) - t0) / 1e9
            ax.plot(times, [p["acceptance"][i] for p in have], marker=".", label=f"position {i + 1}")
        ax.set_ylabel("acceptance")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    else:
        for index in sorted({k for r in gpu for k in r.get("gpus", {})}):
            have = [r for r in gpu if index in r["gpus"]]
            ax.plot(seconds(have), [r["gpus"][index]["sm_clock_mhz"] for r in have], label=f"GPU {index}")
        ax.set_ylabel("SM clock (MHz)")
        ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)


PlotFunction = Callable[[Sequence[VariantView], Path], Path | None]

# (file name, caption, function), in report order: the headline first.
PLOTS: tuple[tuple[str, str, PlotFunction], ...] = (
    ("itl_headline.png", "Token ITL vs chunk ITL per variant", plot_itl_headline),
    ("itl_cdf.png", "ITL distribution per token and per chunk", plot_itl_cdf),
    ("latency_bars.png", "p50/p90/p99 token ITL, TTFT and decode tokens/s", plot_latency_bars),
    ("tokens_per_chunk.png", "Tokens per SSE chunk", plot_tokens_per_chunk),
    ("timeline.png", "Per-request timeline (sample)", plot_timeline),
    ("acceptance.png", "Draft acceptance per position", plot_acceptance),
    ("server_timeline.png", "Stream and server on one clock", plot_server_timeline),
)


def write_plots(
    variants: Sequence[VariantView], out_dir: Path, *, workers: int = 1
) -> list[tuple[str, Path]]:
    """Every figure the run has data for, as (caption, path); stale PNGs of absent figures are removed
    so a re-derived report never shows a picture from an earlier run. With `workers` > 1 (the writer
    passes the cores this process may use) the figures are drawn by that many forked processes at
    once: each PNG the same bytes as drawn here, a run's ~1-5 s of drawing divided by the cores."""
    targets = [out_dir / name for name, _, _ in PLOTS]
    for target in targets:
        target.unlink(missing_ok=True)
    if not variants:
        return []
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        drawn = _draw_forked(variants, targets, workers)
    else:
        drawn = [function(variants, target) for (_, _, function), target in zip(PLOTS, targets, strict=True)]
    return [(caption, path) for (_, caption, _), path in zip(PLOTS, drawn, strict=True) if path is not None]


# The views the drawing processes read, set before the pool forks them: inherited, never pickled (a
# 1024 x 500 run's records are 20 MB of JSON).
_FORKED: list[Sequence[VariantView]] = []


def _draw_forked(variants: Sequence[VariantView], targets: list[Path], workers: int) -> list[Path | None]:
    """PLOTS drawn by `workers` forked processes, the last (the server timeline, the heaviest with
    the ITL CDF) first, so no core waits on it at the end."""
    order = list(reversed(range(len(PLOTS))))
    _FORKED[:] = [variants]
    try:
        with ProcessPoolExecutor(
            min(workers, len(PLOTS)),
            mp_context=multiprocessing.get_context("fork"),
            initializer=_drawing_process,
            initargs=(os.getpid(),),
        ) as pool:
            drawn = dict(zip(order, pool.map(_draw, order, [targets[i] for i in order]), strict=True))
    finally:
        _FORKED.clear()
    return [drawn[i] for i in range(len(PLOTS))]


def _drawing_process(owner: int) -> None:
    """A drawing process dies with the itlaudit that forked it (serve.orphans' PDEATHSIG), and leaves
    a terminal's Ctrl-C to it: the parent decides what an interrupt ends, as with capture workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(owner)


def _draw(index: int, target: Path) -> Path | None:
    return PLOTS[index][2](_FORKED[0], target)
